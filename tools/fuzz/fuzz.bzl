"""heapd_fuzz_test: one *_fuzz.cc, two targets.

    load("//tools/fuzz:fuzz.bzl", "heapd_fuzz_test")

    heapd_fuzz_test(
        name = "metadata_format_fuzz",
        srcs = ["metadata_format_fuzz.cc"],
        deps = [":metadata_format"],
        corpus = "fuzz_corpus/metadata_format",
    )

makes
  - NAME_test, a cc_test that replays every file under `corpus` (a
    directory of this package) and the fuzzer's MakeSeeds() through
    LLVMFuzzerTestOneInput: the corpus is a regression test in every build;
  - NAME, a cc_binary: a libFuzzer binary under --config=fuzz (tools/fuzz.sh
    finds it by its tags and fuzzes it from `corpus`), the same replay driver
    otherwise, so `bazel build //...` keeps it compiling with gcc.

The source defines LLVMFuzzerTestOneInput and heapd::fuzz::MakeSeeds()
(tools/fuzz/fuzz_seeds.h). Keep deps to pure decoding code: under
--config=fuzz only what is built here is instrumented, system libraries are
not.
"""

def heapd_fuzz_test(name, srcs, corpus, deps = [], size = "small", **kwargs):
    # An empty corpus is allowed so that a new fuzzer can write its seeds
    # (--write_corpus); its test fails until they are checked in.
    corpus_files = native.glob([corpus + "/**"])
    corpus_path = (native.package_name() + "/" + corpus).lstrip("/")
    deps = deps + ["//tools/fuzz:fuzz_seeds"]
    tags = kwargs.pop("tags", [])

    native.cc_test(
        name = name + "_test",
        size = size,
        srcs = srcs,
        deps = deps + ["//tools/fuzz:replay_main"],
        data = corpus_files,
        args = [corpus_path],
        tags = tags,
        **kwargs
    )

    native.cc_binary(
        name = name,
        srcs = srcs,
        deps = deps + select({
            "//tools/fuzz:fuzzing": [],
            "//conditions:default": ["//tools/fuzz:replay_main"],
        }),
        linkopts = select({
            "//tools/fuzz:fuzzing": ["-fsanitize=fuzzer"],
            "//conditions:default": [],
        }),
        data = corpus_files,
        # tools/fuzz.sh queries these: which binaries to fuzz, from which corpus.
        tags = tags + ["heapd_fuzzer", "heapd_fuzz_corpus=" + corpus_path],
        **kwargs
    )
