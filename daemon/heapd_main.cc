// heapd: the node-local daemon. Serves every heap on its storage tiers
// (--storage, else --state_dir) over
// gRPC on RUNTIME_DIR/heapd.sock and passes data fds on
// RUNTIME_DIR/heapd.fd.sock. SIGTERM or SIGINT: stop accepting, finish
// in-flight calls (5 s at most), sync every heap, exit 0.
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include <zstd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "daemon/fd_server.h"
#include "daemon/grpc_listener.h"
#include "daemon/health_service.h"
#include "daemon/heap_registry.h"
#include "daemon/heapd_service.h"
#include "daemon/instance_lock.h"
#include "daemon/limits.h"
#include "daemon/metrics.h"
#include "daemon/sessions.h"
#include "daemon/storage_tiers.h"
#include "daemon/unix_listener.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/resource_quota.h"
#include "grpcpp/server_builder.h"
#include "protocol/default_paths.h"
#include "protocol/limits.h"
#include "protocol/version.h"
#include "snapshot/store_recipe.h"
#include "snapshot/store_snapshots.h"
#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/spdlog.h"
#include "util/byte_size.h"
#include "util/errno_status.h"
#include "util/own_directory.h"
#include "util/program_flags.h"
#include "util/run_as.h"
#include "util/running_thread.h"

ABSL_FLAG(std::string, state_dir, "",
          "directory of the heaps (default: /var/lib/heapd for root, else "
          "$XDG_STATE_HOME/heapd or ~/.local/state/heapd)");
ABSL_FLAG(std::string, storage, "",
          "storage tiers heaps are kept on, NAME:PATH,... (e.g. "
          "tmpfs:/dev/shm/heapd,nvme:/var/lib/heapd,dax:/mnt/pmem0/heapd); the first is the "
          "default for new heaps, heaps are found on every tier by name, and each heap and "
          "snapshot records its tier's name (empty: --state_dir is the one tier, 'default'). "
          "--state_dir still holds snapshots and the block cache");
ABSL_FLAG(std::string, runtime_dir, "",
          "directory of heapd.sock and heapd.fd.sock (default: /run/heapd for root, else "
          "$XDG_RUNTIME_DIR/heapd; no default without XDG_RUNTIME_DIR)");
ABSL_FLAG(std::string, metrics_address, "",
          "HOST:PORT for Prometheus metrics over HTTP, or :PORT for the loopback address only "
          "(empty: no metrics endpoint). Heap names are in the metrics: bind beyond loopback "
          "only on a trusted network");
ABSL_FLAG(uint64_t, metrics_heaps, 1000,
          "heaps with per-heap metric series: those with the most reserved bytes (node totals "
          "count every heap; heapd_heaps_unlisted says how many were left out)");
ABSL_FLAG(std::string, size_class_metrics, "",
          "heaps (NAME,...; * for every one) whose size classes get metric series: three per size "
          "class in use, up to 64 classes a heap (empty: none; heapctl heap stat NAME shows them "
          "anyway)");
ABSL_FLAG(std::string, admin_group, "",
          "group (name or gid) whose members may administer every heap, besides root");
ABSL_FLAG(std::string, log_level, "info", "trace, debug, info, warn, error, critical or off");
ABSL_FLAG(heapd::ByteSize, default_max_size, heapd::ByteSize{uint64_t{16} << 30},
          "maximum size of a heap created without one (bytes, or with a unit: 64G = 64GiB)");
ABSL_FLAG(int, attach_token_seconds, 10,
          "how long a client has to fetch the heap's fd after Attach");
ABSL_FLAG(bool, track_contents, true,
          "Roll object contents back to the last sync after a crash (clients keep pre-images "
          "of the pages they write; tmpfs heaps only, see docs/consistency.md). false: only "
          "allocations and names roll back, and attach and stats say so.");
ABSL_FLAG(bool, working_images, true,
          "Heaps created on a block file system or fs-dax get a working image: clients map a "
          "copy in memory (the heap's capacity, counted against --tmpfs_reserve_bytes), and the "
          "data file changes only at syncs, through a redo log, so contents roll back to the "
          "last sync after any crash (docs/consistency.md). false: clients map the data file; "
          "only allocations and names roll back. Heaps keep what they were created with.");
ABSL_FLAG(heapd::ByteSize, working_image_max_bytes, heapd::ByteSize{0},
          "per-heap memory budget of working images: a new heap whose maximum size is above "
          "it is direct by default (--image=working is refused for it), since its working "
          "image grows to the heap's size in memory (0: the node's physical memory)");
ABSL_FLAG(bool, grow_ahead, true,
          "Grow a heap's data file in the background when fewer than a sixteenth of its chunks "
          "are free, so that allocations seldom wait for its space to be reserved (space is "
          "still reserved before it is handed out).");
ABSL_FLAG(heapd::ByteSize, tmpfs_reserve_bytes, heapd::ByteSize{uint64_t{1} << 30},
          "growth of heaps on tmpfs is refused when it would leave less than this much of the "
          "node's available memory (0: never refused)");
ABSL_FLAG(int, oom_score_adj, -900,
          "heapd's OOM score adjustment (-1000..1000): below the jobs', so the kernel's OOM "
          "killer takes a job process before heapd");
ABSL_FLAG(heapd::ByteSize, max_snapshot_reading_bytes, heapd::ByteSize{uint64_t{1} << 30},
          "memory heapd gives to reading snapshots (manifests, metadata) for all calls at once; "
          "a call that would pass it fails and may be tried again");
ABSL_FLAG(int, snapshot_timeout_seconds, 1800,
          "longest a snapshot operation in a caller's directory may run before it is killed");
ABSL_FLAG(std::string, node_name, "",
          "this node's name in the parts it adds to snapshot store versions (default: the "
          "host name)");
ABSL_FLAG(heapd::ByteSize, store_block_bytes, heapd::ByteSize{heapd::kDefaultBlockBytes},
          "block size of snapshot store versions this heapd creates: a power of two from 64 KiB "
          "to 2 MiB (docs/performance.md, B9)");
ABSL_FLAG(int, store_zstd_level, 1,
          "zstd level of the blocks this heapd writes to stores (1: measured in "
          "docs/performance.md, B9: 17% faster creates than 3 for 2.6% more bytes)");
ABSL_FLAG(bool, store_deltas, true,
          "store a changed block as the 512-byte sectors where it differs from this node's "
          "earlier version "
          "of it (docs/snapshot-store.md; docs/performance.md, B9c: 4x fewer bytes for a small "
          "change, about a quarter more create time where most blocks change)");
ABSL_FLAG(int, store_threads, 2,
          "threads one snapshot store create or restore hashes, compresses and reads blocks on "
          "(1 to 16; a node's cores belong to its jobs; each may hold up to 256 descriptors of a "
          "store's directories)");
ABSL_FLAG(heapd::ByteSize, store_cache_bytes, heapd::ByteSize{uint64_t{1} << 30},
          "bytes of blocks heapd keeps in its node-local cache (STATE_DIR/block-cache) so that "
          "restores read from a store only what the node lacks; 0: no cache");
// Per-user limits (daemon/limits.h); root is not limited.
ABSL_FLAG(uint32_t, max_heaps_per_user, heapd::UserLimits().heaps, "heaps a user may own");
ABSL_FLAG(heapd::ByteSize, max_heap_bytes_per_user, heapd::ByteSize{heapd::UserLimits().heap_bytes},
          "sum of the maximum sizes of a user's heaps");
ABSL_FLAG(heapd::ByteSize, max_fixed_address_bytes_per_user,
          heapd::ByteSize{heapd::UserLimits().fixed_address_bytes},
          "bytes of the node's fixed-address window a user's fixed-address heaps may hold "
          "(their maximum sizes plus a 2 MiB guard each; the window is 25 TiB for every user)");
ABSL_FLAG(uint64_t, max_names_per_heap, heapd::UserLimits().names_per_heap,
          "names one heap may hold");
ABSL_FLAG(uint32_t, max_sessions_per_user, heapd::UserLimits().sessions,
          "sessions a user may have attached at once");
ABSL_FLAG(uint32_t, max_connections_per_user, heapd::UserLimits().connections,
          "connections a user may hold open on each of heapd.sock and heapd.fd.sock");
ABSL_FLAG(heapd::ByteSize, max_snapshot_bytes_per_user,
          heapd::ByteSize{heapd::UserLimits().snapshot_bytes},
          "bytes of snapshots a user may keep in heapd's own snapshot directory");
ABSL_FLAG(uint32_t, max_snapshot_calls_per_user, heapd::UserLimits().snapshot_calls,
          "snapshot calls a user may run at once");
ABSL_FLAG(uint32_t, max_calls_per_user, heapd::UserLimits().calls,
          "gRPC calls of a user in flight at once");
ABSL_FLAG(int, max_threads, 1024,
          "threads heapd's gRPC server may use in all; calls beyond wait or are refused");

namespace heapd {
namespace {

absl::StatusOr<std::optional<uint32_t>> ResolveGroup(const std::string& group) {
  if (group.empty()) return std::optional<uint32_t>();
  uint32_t gid;
  if (absl::SimpleAtoi(group, &gid)) return std::optional<uint32_t>(gid);
  const struct group* entry = getgrnam(group.c_str());
  if (entry == nullptr) return absl::NotFoundError("--admin_group: no group named " + group);
  return std::optional<uint32_t>(entry->gr_gid);
}

// Sends `state` to systemd's $NOTIFY_SOCKET, if set.
void NotifySystemd(const char* state) {
  const char* path = std::getenv("NOTIFY_SOCKET");
  if (path == nullptr || path[0] == '\0') return;
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  const size_t length = std::strlen(path);
  if (length >= sizeof(address.sun_path)) return;
  std::memcpy(address.sun_path, path, length);
  if (address.sun_path[0] == '@') address.sun_path[0] = '\0';  // abstract namespace
  const int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return;
  sendto(fd, state, std::strlen(state), MSG_NOSIGNAL, reinterpret_cast<sockaddr*>(&address),
         static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + length));
  close(fd);
}

// --log_level's level; INVALID_ARGUMENT listing the levels for another
// word (spdlog itself takes an unknown one as "off": heapd would run mute).
absl::StatusOr<spdlog::level::level_enum> ParseLogLevel(const std::string& flag) {
  static constexpr const char* kLevels[] = {"trace", "debug",    "info", "warn",
                                            "error", "critical", "off"};
  const std::string word = absl::AsciiStrToLower(flag);
  for (const char* level : kLevels) {
    if (word == level) return spdlog::level::from_str(level);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--log_level=", flag, ": not a level (", absl::StrJoin(kLevels, ", "), ")"));
}

// Flag values that are wrong whatever the machine: refused at start (exit
// 2) rather than served in a way the admin did not ask for.
absl::Status CheckFlags() {
  if (absl::GetFlag(FLAGS_default_max_size).bytes == 0) {
    return absl::InvalidArgumentError("--default_max_size=0: a heap needs a maximum size");
  }
  const uint64_t block = absl::GetFlag(FLAGS_store_block_bytes).bytes;
  if (!ValidBlockBytes(block)) {
    return absl::InvalidArgumentError(absl::StrCat("--store_block_bytes=", FormatByteSize(block),
                                                   ": a power of two from 64K to 2M"));
  }
  if (const int threads = absl::GetFlag(FLAGS_store_threads); threads < 1 || threads > 16) {
    return absl::InvalidArgumentError(
        absl::StrCat("--store_threads=", threads, ": from 1 to 16 threads"));
  }
  if (const int level = absl::GetFlag(FLAGS_store_zstd_level);
      level < ZSTD_minCLevel() || level > ZSTD_maxCLevel()) {
    return absl::InvalidArgumentError(absl::StrCat("--store_zstd_level=", level,
                                                   ": zstd levels are ", ZSTD_minCLevel(), " to ",
                                                   ZSTD_maxCLevel()));
  }
  if (const std::string address = absl::GetFlag(FLAGS_metrics_address); !address.empty()) {
    return CheckMetricsAddress(address);
  }
  return absl::OkStatus();
}

UserLimits LimitsFromFlags() {
  UserLimits limits;
  limits.heaps = absl::GetFlag(FLAGS_max_heaps_per_user);
  limits.heap_bytes = absl::GetFlag(FLAGS_max_heap_bytes_per_user).bytes;
  limits.fixed_address_bytes = absl::GetFlag(FLAGS_max_fixed_address_bytes_per_user).bytes;
  limits.names_per_heap = absl::GetFlag(FLAGS_max_names_per_heap);
  limits.sessions = absl::GetFlag(FLAGS_max_sessions_per_user);
  limits.connections = absl::GetFlag(FLAGS_max_connections_per_user);
  limits.snapshot_bytes = absl::GetFlag(FLAGS_max_snapshot_bytes_per_user).bytes;
  limits.snapshot_calls = absl::GetFlag(FLAGS_max_snapshot_calls_per_user);
  limits.calls = absl::GetFlag(FLAGS_max_calls_per_user);
  return limits;
}

// Creates the runtime directory (mode 0755: every user reaches the
// sockets) and refuses one that another user owns or may write, where
// someone else could replace heapd's sockets.
absl::Status PrepareRuntimeDir(const std::string& dir) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) return absl::InternalError(absl::StrCat("create ", dir, ": ", error.message()));
  absl::StatusOr<UniqueFd> fd = OpenOwnDirectory(dir, "--runtime_dir");
  if (!fd.ok()) return fd.status();
  if (fchmod(fd->get(), 0755) != 0) return ErrnoStatus(errno, absl::StrCat("chmod ", dir));
  return absl::OkStatus();
}

// Lowers (or sets) heapd's OOM score adjustment: losing heapd ends every
// session on the node at once. Lowering it needs CAP_SYS_RESOURCE; without
// it heapd says so and goes on.
void SetOomScore(int adjustment) {
  std::ofstream file("/proc/self/oom_score_adj");
  file << adjustment;
  file.flush();
  if (!file) {
    spdlog::warn("could not set the OOM score adjustment to {} (needs CAP_SYS_RESOURCE)",
                 adjustment);
  }
}

// Many clients hold two connections each: take every descriptor allowed.
void RaiseDescriptorLimit() {
  rlimit limit;
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    setrlimit(RLIMIT_NOFILE, &limit);
  }
}

// Makes the runtime and state directories and the storage tiers' roots
// heapd's own (created if missing) and takes their instance locks, before
// anything in any is touched: its sockets, its heaps.
absl::StatusOr<std::vector<InstanceLock>> TakeDirectories(const std::string& state_dir,
                                                          const std::string& runtime_dir,
                                                          const std::vector<StorageTier>& tiers) {
  if (absl::Status s = PrepareRuntimeDir(runtime_dir); !s.ok()) return s;
  std::vector<std::pair<std::string, std::string>> dirs = {{runtime_dir, "--runtime_dir"},
                                                           {state_dir, "--state_dir"}};
  for (const StorageTier& tier : tiers) {
    if (tier.root != state_dir) dirs.emplace_back(tier.root, "--storage tier " + tier.name);
  }
  for (size_t i = 1; i < dirs.size(); ++i) {
    const auto& [dir, flag] = dirs[i];
    const std::filesystem::path parent = std::filesystem::path(dir).parent_path();
    std::error_code error;
    // The state directory's parents are made; a tier's must exist (its
    // mount): heapd never puts heaps meant for NVMe on the root disk.
    if (i == 1) std::filesystem::create_directories(parent, error);
    if (absl::Status s = MakeOwnDirectory(dir, 0700, flag).status(); !s.ok()) return s;
    struct stat st;
    if (stat(parent.c_str(), &st) == 0 && (st.st_mode & 0002) != 0) {
      spdlog::warn(
          "{} ({}) is in {}, which every user may write: after a reboot anyone can take its "
          "name before heapd starts and keep heapd from starting; prefer a directory only root "
          "may write (docs/operations.md, \"Storage tiers\")",
          flag, dir, parent.string());
    }
  }
  std::vector<InstanceLock> locks;
  for (const auto& [dir, flag] : dirs) {
    absl::StatusOr<InstanceLock> lock = InstanceLock::Take(dir, flag);
    if (!lock.ok()) return lock.status();
    if (!lock->warning().empty()) spdlog::warn("{}", lock->warning());
    locks.push_back(*std::move(lock));
  }
  return locks;
}

HeapOptions HeapOptionsFromFlags(const UserLimits& limits) {
  HeapOptions options;
  options.max_names = limits.names_per_heap;
  options.tmpfs_reserve_bytes = absl::GetFlag(FLAGS_tmpfs_reserve_bytes).bytes;
  options.track_contents = absl::GetFlag(FLAGS_track_contents);
  options.grow_ahead = absl::GetFlag(FLAGS_grow_ahead);
  options.working_images = absl::GetFlag(FLAGS_working_images);
  options.working_image_max_bytes = absl::GetFlag(FLAGS_working_image_max_bytes).bytes;
  if (options.working_image_max_bytes == 0) {
    options.working_image_max_bytes = static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) *
                                      static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  }
  return options;
}

// Directory snapshots: heapd's own in STATE/snapshots, and callers'.
// `stop_fd` readable: their helpers are killed.
absl::StatusOr<std::unique_ptr<SnapshotStore>> OpenSnapshots(const std::string& state_dir,
                                                             const std::vector<StorageTier>& tiers,
                                                             const UserLimits& limits,
                                                             int stop_fd) {
  SnapshotStoreOptions options;
  options.timeout = absl::Seconds(absl::GetFlag(FLAGS_snapshot_timeout_seconds));
  options.cancel_fd = stop_fd;
  options.max_bytes_per_user = limits.snapshot_bytes;
  options.max_reading_bytes = absl::GetFlag(FLAGS_max_snapshot_reading_bytes).bytes;
  std::vector<std::string> own = {state_dir};
  for (const StorageTier& tier : tiers) own.push_back(tier.root);
  return SnapshotStore::Open(state_dir + "/snapshots", own, options);
}

// Snapshot stores, as this node (--node_name, else the host name), with
// the block cache in STATE/block-cache.
absl::StatusOr<std::unique_ptr<StoreSnapshots>> OpenStoreVersions(SnapshotStore* snapshots,
                                                                  const std::string& state_dir) {
  StoreSnapshotsOptions options;
  options.node = absl::GetFlag(FLAGS_node_name);
  if (options.node.empty()) {
    char host[256] = {};
    (void)gethostname(host, sizeof(host) - 1);
    options.node = host;
  }
  options.block_bytes = static_cast<uint32_t>(absl::GetFlag(FLAGS_store_block_bytes).bytes);
  options.zstd_level = absl::GetFlag(FLAGS_store_zstd_level);
  options.deltas = absl::GetFlag(FLAGS_store_deltas);
  options.threads = absl::GetFlag(FLAGS_store_threads);
  options.cache_bytes = absl::GetFlag(FLAGS_store_cache_bytes).bytes;
  if (options.cache_bytes != 0) options.cache_dir = state_dir + "/block-cache";
  return StoreSnapshots::Open(snapshots, options);
}

// Serves the metrics on --metrics_address (none if empty). An address
// another process holds (any local user may bind a loopback port first)
// must not keep heapd down: it serves without metrics, and the thread
// returned tries the address again every 10 s until it gets it or
// `stop_fd` becomes readable. Not joinable if there is nothing to retry.
std::thread ServeMetrics(Metrics* metrics, HeapRegistry* heaps, Sessions* sessions, int stop_fd) {
  const std::string address = absl::GetFlag(FLAGS_metrics_address);
  if (address.empty()) return std::thread();
  auto serve = [metrics, heaps, sessions, address] {
    MetricsOptions options;
    options.max_heaps = absl::GetFlag(FLAGS_metrics_heaps);
    for (absl::string_view heap :
         absl::StrSplit(absl::GetFlag(FLAGS_size_class_metrics), ',', absl::SkipEmpty())) {
      if (heap == "*") options.size_classes_of_every_heap = true;
      options.size_classes_of.emplace(heap);
    }
    const absl::Status served = metrics->Serve(address, heaps, sessions, options);
    if (served.ok()) {
      spdlog::info("metrics on http://{}/metrics (port {})", MetricsBindAddress(address),
                   metrics->port());
    }
    return served;
  };
  const absl::Status served = serve();
  if (served.ok()) return std::thread();
  spdlog::error("{}; serving without metrics, trying again every 10 s", served.ToString());
  return StartRunningThread([serve, stop_fd] {
    for (;;) {
      pollfd stop{stop_fd, POLLIN, 0};
      if (poll(&stop, 1, 10000) != 0 || serve().ok()) return;
    }
  });
}

// The gRPC server of `service` and `health`, on no port yet (the listener
// hands it the connections of heapd.sock). Null if it did not start.
std::unique_ptr<grpc::Server> StartGrpcServer(HeapdService* service, HealthService* health) {
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.RegisterService(service);
  builder.RegisterService(health);
  builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
  builder.SetMaxSendMessageSize(kMaxMessageBytes);
  // Bounded threads, and streams per connection: with the per-user limits
  // of calls and connections, no user can make heapd spawn threads until
  // the node's pid space runs out.
  grpc::ResourceQuota quota("heapd");
  quota.SetMaxThreads(absl::GetFlag(FLAGS_max_threads));
  builder.SetResourceQuota(quota);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, 64);
  return builder.BuildAndStart();
}

// The fd server on heapd.fd.sock (`socket`): redeems attach tokens for
// heap descriptors and answers the sessions' requests.
std::unique_ptr<FdServer> StartFdServer(int socket, uint32_t max_connections, Sessions* sessions,
                                        Metrics* metrics) {
  FdServer::Callbacks callbacks;
  callbacks.redeem = [sessions](const std::string& token,
                                const Caller& caller) -> absl::StatusOr<FdServer::Grant> {
    absl::StatusOr<Sessions::Redeemed> redeemed = sessions->Redeem(token, caller);
    if (!redeemed.ok()) return redeemed.status();
    return FdServer::Grant{redeemed->session, redeemed->fd, redeemed->journal_fd};
  };
  callbacks.closed = [sessions](ClientId id) { sessions->ConnectionClosed(id); };
  callbacks.tick = [sessions] { sessions->ExpireTokens(); };
  callbacks.request = [sessions](ClientId id, absl::string_view request) {
    return sessions->AnswerFdRequest(id, request);
  };
  callbacks.refused = [metrics] { metrics->CountLimitRefusal("connections_per_user"); };
  return std::make_unique<FdServer>(socket, max_connections, std::move(callbacks));
}

int Run() {
  const std::string state_dir =
      absl::GetFlag(FLAGS_state_dir).empty() ? DefaultStateDir() : absl::GetFlag(FLAGS_state_dir);
  const std::string runtime_dir = absl::GetFlag(FLAGS_runtime_dir).empty()
                                      ? DefaultRuntimeDir()
                                      : absl::GetFlag(FLAGS_runtime_dir);
  if (state_dir.empty() || runtime_dir.empty()) {
    spdlog::critical("no {} directory: pass --{} (or set {})",
                     state_dir.empty() ? "state" : "runtime",
                     state_dir.empty() ? "state_dir" : "runtime_dir",
                     state_dir.empty() ? "HOME or XDG_STATE_HOME" : "XDG_RUNTIME_DIR");
    return 2;
  }
  absl::StatusOr<std::vector<StorageTier>> tiers =
      StorageTiersFromFlags(absl::GetFlag(FLAGS_storage), state_dir);
  if (!tiers.ok()) {
    spdlog::critical("{}", std::string(tiers.status().message()));
    return 2;
  }
  const UserLimits limits = LimitsFromFlags();
  RaiseDescriptorLimit();
  absl::StatusOr<std::optional<uint32_t>> admin_gid =
      ResolveGroup(absl::GetFlag(FLAGS_admin_group));
  if (!admin_gid.ok()) {
    spdlog::critical("{}", admin_gid.status().ToString());
    return 2;
  }
  absl::StatusOr<std::vector<InstanceLock>> locks = TakeDirectories(state_dir, runtime_dir, *tiers);
  if (!locks.ok()) {
    spdlog::critical("{}", std::string(locks.status().message()));
    return 1;
  }
  if (std::none_of(tiers->begin(), tiers->end(),
                   [&](const StorageTier& tier) { return tier.root == state_dir; })) {
    std::error_code error;
    if (!std::filesystem::is_empty(state_dir + "/heaps", error) && !error) {
      spdlog::warn(
          "{}/heaps holds heaps, but --storage does not name {} as a tier: they are "
          "not served",
          state_dir, state_dir);
    }
  }
  SetOomScore(absl::GetFlag(FLAGS_oom_score_adj));
  // The sockets next, before any heap opens: one that a process (a heapd
  // from before these locks) answers on stops this heapd before it touches
  // a heap. Connections made from here wait until the service starts.
  const std::string grpc_path = runtime_dir + "/" + kGrpcSocketName;
  const std::string fd_path = runtime_dir + "/" + kFdSocketName;
  absl::StatusOr<ListeningSocket> grpc_socket = ListenUnix(grpc_path);
  if (!grpc_socket.ok()) {
    spdlog::critical("{}", grpc_socket.status().ToString());
    return 1;
  }
  absl::StatusOr<ListeningSocket> fd_socket = ListenUnix(fd_path);
  if (!fd_socket.ok()) {
    close(grpc_socket->fd);
    grpc_socket->Remove();
    spdlog::critical("{}", fd_socket.status().ToString());
    return 1;
  }
  // Only sockets this heapd bound are removed, however it ends from here.
  absl::Cleanup remove_sockets = [&] {
    grpc_socket->Remove();
    fd_socket->Remove();
  };

  // Signals are taken by sigwait below; threads started from here on
  // inherit the mask.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);
  // The helpers' spawner starts while the heaps open (after the mask: its
  // thread is heapd's): no snapshot call waits for it. Started again on
  // use if this fails.
  if (absl::Status s = StartRunAsSpawner(); !s.ok()) spdlog::warn("{}", s.ToString());

  absl::StatusOr<std::unique_ptr<HeapRegistry>> heaps =
      HeapRegistry::Open(*tiers, HeapOptionsFromFlags(limits), limits);
  if (!heaps.ok()) {
    spdlog::critical("{}", heaps.status().ToString());
    return 1;
  }
  // Readable once heapd stops: waits end and snapshot workers are killed.
  const int stop_fd = eventfd(0, EFD_CLOEXEC);
  absl::StatusOr<std::unique_ptr<SnapshotStore>> snapshots =
      OpenSnapshots(state_dir, *tiers, limits, stop_fd);
  if (!snapshots.ok()) {
    spdlog::critical("{}", snapshots.status().ToString());
    return 1;
  }
  absl::StatusOr<std::unique_ptr<StoreSnapshots>> versions =
      OpenStoreVersions(snapshots->get(), state_dir);
  if (!versions.ok()) {
    spdlog::critical("{} (--node_name, --store_block_bytes)", versions.status().ToString());
    return 1;
  }
  Metrics metrics;
  Sessions sessions(absl::Seconds(absl::GetFlag(FLAGS_attach_token_seconds)), limits.sessions,
                    &metrics);
  std::thread metrics_binder = ServeMetrics(&metrics, heaps->get(), &sessions, stop_fd);
  absl::Cleanup stop_binder = [&metrics_binder, stop_fd] {
    if (!metrics_binder.joinable()) return;
    const uint64_t one = 1;
    (void)!write(stop_fd, &one, sizeof(one));
    metrics_binder.join();
  };
  std::unique_ptr<GrpcListener> listener;
  ServiceOptions options;
  options.admin_gid = *admin_gid;
  options.default_max_size = absl::GetFlag(FLAGS_default_max_size).bytes;
  options.limits = limits;
  options.stop_fd = stop_fd;
  DirectorySnapshots directory_snapshots(snapshots->get(), &metrics);
  StoreBackend store_versions(versions->get(), &metrics);
  HeapdService service(
      heaps->get(), &sessions,
      {&directory_snapshots, &store_versions, snapshots->get(), versions->get()}, &metrics,
      [&listener](const std::string& peer) { return listener->CallerOf(peer); }, options);
  HealthService health;
  std::unique_ptr<grpc::Server> server = StartGrpcServer(&service, &health);
  if (server == nullptr) {
    spdlog::critical("the gRPC server did not start");
    return 1;
  }
  listener = std::make_unique<GrpcListener>(
      grpc_socket->fd, server.get(), limits.connections,
      [&metrics] { metrics.CountLimitRefusal("connections_per_user"); });
  // Only now: a call on the first connection reaches `listener` (the
  // handlers' CallerOf), which must be set by then.
  listener->Start();

  std::unique_ptr<FdServer> fd_server =
      StartFdServer(fd_socket->fd, limits.connections, &sessions, &metrics);

  std::vector<std::string> tier_names;
  for (const StorageTier& tier : *tiers) tier_names.push_back(tier.name + ":" + tier.root);
  spdlog::info("heapd serving {} heaps from {} on {} and {}", (*heaps)->List().size(),
               absl::StrJoin(tier_names, ","), grpc_path, fd_path);
  NotifySystemd("READY=1");

  int signal_number = 0;
  sigwait(&stop_signals, &signal_number);
  spdlog::info("{}: stopping", strsignal(signal_number));
  NotifySystemd("STOPPING=1");
  health.SetShuttingDown();
  const uint64_t one = 1;
  (void)!write(stop_fd, &one, sizeof(one));  // waits end, snapshot workers die
  listener->StopAccepting();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  fd_server.reset();
  std::move(remove_sockets).Invoke();
  std::move(stop_binder).Invoke();
  const absl::Status synced = (*heaps)->SyncAll();
  spdlog::info("heapd stopped{}", synced.ok() ? "; every heap synced" : "; a sync failed");
  return synced.ok() ? 0 : 1;
}

}  // namespace
}  // namespace heapd

int main(int argc, char** argv) {
  // Before anything else: heapd is also its own RunAs helper.
  if (heapd::StartedAsRunAsHelper(argc, argv)) return heapd::RunAsHelperMain();
  const std::vector<char*> positional = heapd::ParseProgramFlags(
      argc, argv,
      "heapd: node-local daemon serving persistent heaps\n"
      "usage: heapd [--state_dir=DIR] [--runtime_dir=DIR] [--metrics_address=HOST:PORT] [FLAG...]",
      heapd::kHeapdVersion);
  spdlog::set_default_logger(spdlog::stderr_color_mt("heapd"));
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ %v");
  if (positional.size() > 1) {
    spdlog::critical("heapd takes flags only; '{}' is not a flag (heapd --help lists them)",
                     positional[1]);
    return 2;
  }
  absl::StatusOr<spdlog::level::level_enum> level =
      heapd::ParseLogLevel(absl::GetFlag(FLAGS_log_level));
  if (!level.ok()) {
    spdlog::critical("{}", std::string(level.status().message()));
    return 2;
  }
  spdlog::set_level(*level);
  if (absl::Status s = heapd::CheckFlags(); !s.ok()) {
    spdlog::critical("{}", std::string(s.message()));
    return 2;
  }
  return heapd::Run();
}
