#include "daemon/session_table.h"

#include <sys/random.h>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace heapd {
namespace {

// 128 random bits, hex: unguessable.
std::string NewToken() {
  char bytes[16];
  size_t got = 0;
  while (got < sizeof(bytes)) {
    const ssize_t n = getrandom(bytes + got, sizeof(bytes) - got, 0);
    if (n > 0) got += static_cast<size_t>(n);
  }
  return absl::BytesToHexString(absl::string_view(bytes, sizeof(bytes)));
}

// 63 random bits (ids stay positive in JSON and in logs), never 0.
ClientId NewSessionId() {
  uint64_t id = 0;
  while (getrandom(&id, sizeof(id), 0) != sizeof(id)) {
  }
  return id >> 1;
}

}  // namespace

absl::StatusOr<SessionTable::Started> SessionTable::Start(std::shared_ptr<ServedHeap> heap,
                                                          const Caller& caller, bool read_only) {
  std::string token = NewToken();
  absl::MutexLock lock(&mu_);
  uint32_t& count = per_user_[caller.uid];
  if (caller.uid != 0 && count >= max_per_user_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("uid ", caller.uid, " has ", count,
                     " sessions attached, its limit (--max_sessions_per_user)"));
  }
  ++count;
  // Random, not counted: ids are unique across heapd's restarts, so a
  // process holding the id of a session that ended with an earlier heapd
  // cannot act on a new session that happens to get the same number.
  ClientId id = 0;
  while (id == 0 || sessions_.count(id) != 0) id = NewSessionId();
  auto session = std::make_shared<Session>(id, std::move(heap), caller, read_only);
  sessions_.emplace(session->id, Entry{session, token, absl::Now() + token_lifetime_});
  tokens_.emplace(token, session->id);
  return Started{session, token};
}

absl::StatusOr<std::shared_ptr<Session>> SessionTable::Get(ClientId id,
                                                           const Caller& caller) const {
  if (id == 0) return absl::InvalidArgumentError("session 0 does not exist; attach first");
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end()) {
    return absl::NotFoundError(absl::StrCat("no session ", id, " (it detached or ended)"));
  }
  if (it->second.session->caller.uid != caller.uid) {
    return absl::PermissionDeniedError(
        absl::StrCat("session ", id, " belongs to another user (uid ",
                     it->second.session->caller.uid, "), not to uid ", caller.uid));
  }
  return it->second.session;
}

std::shared_ptr<Session> SessionTable::Find(ClientId id) const {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  return it == sessions_.end() ? nullptr : it->second.session;
}

absl::StatusOr<std::shared_ptr<Session>> SessionTable::Redeem(const std::string& token,
                                                              const Caller& caller) {
  absl::MutexLock lock(&mu_);
  auto it = tokens_.find(token);
  if (it == tokens_.end()) return absl::NotFoundError("unknown, used or expired fd token");
  Entry& entry = sessions_.at(it->second);
  if (entry.session->caller.uid != caller.uid) {
    return absl::PermissionDeniedError(
        absl::StrCat("the fd token of session ", entry.session->id, " was issued to uid ",
                     entry.session->caller.uid, ", not to uid ", caller.uid));
  }
  if (absl::Now() > entry.token_deadline) {
    return absl::NotFoundError(
        absl::StrCat("the fd token of session ", entry.session->id, " expired"));
  }
  tokens_.erase(it);
  entry.token.clear();
  return entry.session;
}

std::shared_ptr<Session> SessionTable::Take(ClientId id) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return nullptr;
  std::shared_ptr<Session> session = std::move(it->second.session);
  if (!it->second.token.empty()) tokens_.erase(it->second.token);
  sessions_.erase(it);
  Forget(session->caller.uid);
  return session;
}

std::vector<std::shared_ptr<Session>> SessionTable::TakeExpired(absl::Time now) {
  absl::MutexLock lock(&mu_);
  std::vector<std::shared_ptr<Session>> expired;
  for (auto it = sessions_.begin(); it != sessions_.end();) {
    if (!it->second.token.empty() && now > it->second.token_deadline) {
      tokens_.erase(it->second.token);
      Forget(it->second.session->caller.uid);
      expired.push_back(std::move(it->second.session));
      it = sessions_.erase(it);
    } else {
      ++it;
    }
  }
  return expired;
}

void SessionTable::Forget(uint32_t uid) {
  auto it = per_user_.find(uid);
  if (it != per_user_.end() && --it->second == 0) per_user_.erase(it);
}

std::vector<std::shared_ptr<Session>> SessionTable::List() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::shared_ptr<Session>> sessions;
  for (const auto& [id, entry] : sessions_) sessions.push_back(entry.session);
  return sessions;
}

size_t SessionTable::CountOn(absl::string_view heap_name) const {
  absl::MutexLock lock(&mu_);
  size_t count = 0;
  for (const auto& [id, entry] : sessions_) count += entry.session->heap->name == heap_name;
  return count;
}

bool SessionTable::Connected(ClientId id) const {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  return it != sessions_.end() && it->second.token.empty();
}

}  // namespace heapd
