#include "runtime/disk_cache.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <utime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <sstream>
#include <vector>

namespace torch_tpu::runtime {

namespace fs = std::filesystem;

namespace {
constexpr char kMagic[8] = {'T', 'T', 'P', 'U', 'X', 'C', '0', '1'};

struct Header {
  char magic[8];
  uint64_t key_size;
  uint64_t payload_size;
  uint64_t checksum;  // of key + payload
};

std::string Hex(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}
}  // namespace

uint64_t Fnv1a64(const std::string& data, uint64_t seed) {
  uint64_t h = seed;
  for (unsigned char c : data) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  return h;
}

namespace {
// Who may write `st` besides this user, or "" when no one (root may).
std::string OtherWriters(const std::string& path, const struct stat& st, bool sticky_ok) {
  char mode[8];
  std::snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(st.st_mode & 07777));
  if (st.st_uid != getuid() && st.st_uid != 0)
    return path + " is owned by uid " + std::to_string(st.st_uid) + ", not by this user (uid " +
           std::to_string(getuid()) + "): use a cache directory of your own (TORCH_TPU_CACHE_DIR)";
  if (!(st.st_mode & (S_IWGRP | S_IWOTH)) || (sticky_ok && (st.st_mode & S_ISVTX))) return "";
  return path + " is " + ((st.st_mode & S_IWOTH) ? "world" : "group") + "-writable (mode " +
         mode + "): chmod go-w " + path;
}
}  // namespace

std::string UnsafeCacheReason(const std::string& path, bool parents) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return "";  // absent: nothing to trust yet
  std::string why = OtherWriters(path, st, /*sticky_ok=*/false);
  if (!why.empty() || !parents) return why;
  std::error_code ec;
  fs::path p = fs::weakly_canonical(fs::absolute(path, ec), ec);
  for (p = p.parent_path(); !ec && !p.empty(); p = p.parent_path()) {
    if (stat(p.c_str(), &st) == 0 && !(why = OtherWriters(p.string(), st, true)).empty())
      return "its parent " + why;
    if (p == p.parent_path()) break;
  }
  return "";
}

DiskCache::DiskCache(std::string dir, uint64_t max_bytes)
    : dir_(std::move(dir)), max_bytes_(max_bytes) {
  if (dir_.empty()) return;
  std::error_code ec;
  if (fs::create_directories(dir_, ec)) fs::permissions(dir_, fs::perms::owner_all, ec);
  if (ec) {
    std::cerr << "torch_tpu: compilation cache disabled: cannot create " << dir_ << ": "
              << ec.message() << "\n";
    dir_.clear();
    return;
  }
  std::string why = UnsafeCacheReason(dir_, /*parents=*/true);
  if (!why.empty()) {
    Refuse(dir_, why);
    dir_.clear();
  }
}

void DiskCache::Refuse(const std::string& path, const std::string& why) {
  if (refused_.exchange(true)) return;
  std::cerr << "torch_tpu: disk compilation cache turned off for this run: " << why
            << ". It holds native code that torch_tpu loads and runs, so no other user may be "
               "able to write it (as ssh refuses a key file that others can write).\n";
}

bool DiskCache::Trusts(const std::string& path) {
  if (refused_) return false;
  std::string why = UnsafeCacheReason(path);
  if (why.empty()) return true;
  Refuse(path, why);
  return false;
}

std::string DiskCache::Subdir(const std::string& name) {
  if (!enabled()) return "";
  std::string path = dir_ + "/" + name;
  std::error_code ec;
  if (fs::create_directory(path, ec)) fs::permissions(path, fs::perms::owner_all, ec);
  if (ec || !Trusts(path)) return "";
  return path;
}

std::vector<std::pair<std::string, std::string>> DiskCache::ReadManifest(const std::string& path) {
  if (!enabled() || !Trusts(path)) return {};
  return ::torch_tpu::runtime::ReadManifest(path);
}

void DiskCache::AppendToManifest(const std::string& path, const std::string& record) {
  if (!enabled()) return;
  int fd = open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return;
  ssize_t written = write(fd, record.data(), record.size());
  (void)written;  // a lost record only costs a prefetch
  close(fd);
}

std::string HashName(const std::string& key) {
  return Hex(Fnv1a64(key)) + Hex(Fnv1a64(key, 0x9e3779b97f4a7c15ULL));
}

std::string DiskCache::PathFor(const std::string& key) const {
  return dir_ + "/" + HashName(key) + ".xc";
}

std::optional<std::pair<std::string, std::string>> DiskCache::ReadEntry(const std::string& path) {
  if (!Trusts(path)) return std::nullopt;
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  auto bad = [&](const char* why) -> std::optional<std::pair<std::string, std::string>> {
    ++corrupted;
    if (!warned_.exchange(true)) {
      std::cerr << "torch_tpu: ignoring a damaged compilation cache entry (" << why << "): "
                << path << " (it is removed and recompiled; further ones are not reported)\n";
    }
    std::error_code ec;
    fs::remove(path, ec);
    return std::nullopt;
  };
  Header h;
  if (!in.read(reinterpret_cast<char*>(&h), sizeof(h))) return bad("truncated header");
  if (std::memcmp(h.magic, kMagic, sizeof(kMagic)) != 0) return bad("bad magic");
  if (h.key_size > (1ULL << 32) || h.payload_size > (1ULL << 36)) return bad("bad sizes");
  std::string stored_key(h.key_size, '\0'), payload(h.payload_size, '\0');
  if (!in.read(stored_key.data(), static_cast<std::streamsize>(h.key_size)) ||
      !in.read(payload.data(), static_cast<std::streamsize>(h.payload_size)))
    return bad("truncated");
  if (Fnv1a64(payload, Fnv1a64(stored_key)) != h.checksum) return bad("checksum mismatch");
  utime(path.c_str(), nullptr);  // LRU: mark as recently used
  return std::make_pair(std::move(stored_key), std::move(payload));
}

std::optional<std::string> DiskCache::Load(const std::string& key) {
  if (!enabled()) return std::nullopt;
  auto entry = ReadEntry(PathFor(key));
  if (!entry || entry->first != key) {  // absent, damaged, or a hash collision
    ++misses;
    return std::nullopt;
  }
  ++hits;
  return std::move(entry->second);
}

void DiskCache::Store(const std::string& key, const std::string& payload) {
  if (!enabled()) return;
  std::string path = PathFor(key);
  std::random_device rd;
  std::string tmp = path + ".tmp." + std::to_string(getpid()) + "." + Hex(rd());
  std::error_code ec_perms;  // entries are private to the user
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return;
    Header h;
    std::memcpy(h.magic, kMagic, sizeof(kMagic));
    h.key_size = key.size();
    h.payload_size = payload.size();
    h.checksum = Fnv1a64(payload, Fnv1a64(key));
    out.write(reinterpret_cast<const char*>(&h), sizeof(h));
    out.write(key.data(), static_cast<std::streamsize>(key.size()));
    out.write(payload.data(), static_cast<std::streamsize>(payload.size()));
    out.flush();
    fs::permissions(tmp, fs::perms::owner_read | fs::perms::owner_write, ec_perms);
    if (!out) {
      std::error_code ec;
      fs::remove(tmp, ec);
      return;
    }
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);  // atomic on POSIX
  if (ec) {
    fs::remove(tmp, ec);
    return;
  }
  Evict();
}

void DiskCache::Evict() {
  struct Entry {
    fs::path path;
    uint64_t size;
    fs::file_time_type time;
  };
  std::vector<Entry> entries;
  uint64_t total = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir_, ec)) {
    if (e.path().extension() != ".xc") continue;
    std::error_code e1, e2;
    uint64_t size = e.file_size(e1);
    auto time = e.last_write_time(e2);
    if (e1 || e2) continue;
    entries.push_back({e.path(), size, time});
    total += size;
  }
  if (total <= max_bytes_) return;
  std::sort(entries.begin(), entries.end(),
            [](const Entry& a, const Entry& b) { return a.time < b.time; });
  for (const auto& e : entries) {
    if (total <= max_bytes_) break;
    fs::remove(e.path, ec);
    total -= e.size;
  }
}

std::string ManifestRecord(const std::string& key, const std::string& file) {
  return file + " " + std::to_string(key.size()) + "\n" + key + "\n";
}

std::vector<std::pair<std::string, std::string>> ReadManifest(const std::string& path) {
  std::vector<std::pair<std::string, std::string>> records;
  std::ifstream in(path, std::ios::binary);
  std::string line;
  while (std::getline(in, line)) {
    size_t space = line.find(' ');
    if (space == std::string::npos || space == 0) break;
    uint64_t size = 0;
    try {
      size = std::stoull(line.substr(space + 1));
    } catch (const std::exception&) {
      break;
    }
    if (size > (1ULL << 20)) break;
    std::string key(size, '\0');
    char newline = 0;
    if (!in.read(key.data(), static_cast<std::streamsize>(size)) || !in.get(newline) ||
        newline != '\n')
      break;
    records.emplace_back(std::move(key), line.substr(0, space));
  }
  return records;
}

}  // namespace torch_tpu::runtime
