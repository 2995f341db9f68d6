#include "runtime/disk_cache.h"

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

DiskCache::DiskCache(std::string dir, uint64_t max_bytes)
    : dir_(std::move(dir)), max_bytes_(max_bytes) {
  if (dir_.empty()) return;
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) {
    std::cerr << "torch_tpu: compilation cache disabled: cannot create " << dir_ << ": "
              << ec.message() << "\n";
    dir_.clear();
  }
}

std::string HashName(const std::string& key) {
  return Hex(Fnv1a64(key)) + Hex(Fnv1a64(key, 0x9e3779b97f4a7c15ULL));
}

std::string DiskCache::PathFor(const std::string& key) const {
  return dir_ + "/" + HashName(key) + ".xc";
}

std::optional<std::pair<std::string, std::string>> DiskCache::ReadEntry(const std::string& path) {
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
