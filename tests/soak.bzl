"""The soak test (tests/soak_test.cc) as a target: one per heap kind."""

def soak_test(name, args = []):
    native.cc_test(
        name = name,
        size = "large",
        srcs = ["soak_test.cc"],
        args = args,
        data = [
            ":soak_worker",
            "//daemon:heapd",
        ],
        tags = [
            "exclusive",
            "no-sandbox",
        ],
        deps = [
            ":soak_control",
            "//testing:test_daemon",
            "//client:heapd_client",
            "@system//:absl",
            "@system//:grpc",
            "@system//:gtest",
        ],
    )
