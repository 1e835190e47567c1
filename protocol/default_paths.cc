#include "protocol/default_paths.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>

namespace heapd {
namespace {

std::string Env(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? "" : value;
}

bool Exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

}  // namespace

std::string DefaultStateDir() {
  if (geteuid() == 0) return "/var/lib/heapd";
  if (const std::string xdg = Env("XDG_STATE_HOME"); !xdg.empty()) return xdg + "/heapd";
  if (const std::string home = Env("HOME"); !home.empty()) return home + "/.local/state/heapd";
  return "";
}

std::string DefaultRuntimeDir() {
  if (geteuid() == 0) return kSystemRuntimeDir;
  if (const std::string xdg = Env("XDG_RUNTIME_DIR"); !xdg.empty()) return xdg + "/heapd";
  return "";
}

std::string DefaultSocketPath() {
  if (const std::string env = Env("HEAPD_SOCKET"); !env.empty()) return env;
  if (const std::string own = DefaultRuntimeDir(); !own.empty() && geteuid() != 0) {
    const std::string socket = own + "/" + kGrpcSocketName;
    if (Exists(socket)) return socket;
  }
  return std::string(kSystemRuntimeDir) + "/" + kGrpcSocketName;
}

std::string FdSocketBeside(const std::string& grpc_socket) {
  const size_t slash = grpc_socket.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "." : grpc_socket.substr(0, slash);
  return dir + "/" + kFdSocketName;
}

}  // namespace heapd
