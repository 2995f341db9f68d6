// Persistent tier of the compilation cache: serialized executables on disk.
//
// An entry is keyed by everything that determines the executable: the module
// text, the compile options, and the plugin's platform, platform version and
// XLA version, so a different plugin never loads a stale executable. The full
// key is stored in the entry and compared on load (hash collisions are
// harmless). Writes go to a temporary file renamed into place (a killed
// writer leaves no broken entry); a corrupted or truncated entry is detected
// by its checksum, reported once, removed and recompiled. The directory is
// bounded in size; the least recently used entries are evicted first.
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace torch_tpu::runtime {

class DiskCache {
 public:
  // `dir` empty: disabled.
  DiskCache(std::string dir, uint64_t max_bytes);
  bool enabled() const { return !dir_.empty(); }
  const std::string& dir() const { return dir_; }

  std::optional<std::string> Load(const std::string& key);
  void Store(const std::string& key, const std::string& payload);
  // The entry file that holds `key` (whether or not it exists).
  std::string PathFor(const std::string& key) const;
  // Reads an entry file by path: (stored key, payload) if intact; a damaged
  // entry is reported once and removed. Thread-safe; touches no counters
  // but `corrupted`.
  std::optional<std::pair<std::string, std::string>> ReadEntry(const std::string& path);

  int64_t hits = 0;
  int64_t misses = 0;
  std::atomic<int64_t> corrupted{0};

 private:
  void Evict();
  std::string dir_;
  uint64_t max_bytes_;
  std::atomic<bool> warned_{false};
};

// Prefetch manifest: the executables one program used, in first-use order,
// as (in-memory cache key, entry file name) records. Records are
// length-prefixed, so keys may hold any byte; a truncated tail (a killed
// writer) ends the list.
std::vector<std::pair<std::string, std::string>> ReadManifest(const std::string& path);
std::string ManifestRecord(const std::string& key, const std::string& file);

uint64_t Fnv1a64(const std::string& data, uint64_t seed = 1469598103934665603ULL);
// 32 hex digits (two seeded FNV-1a hashes): the file name stem for `key`.
std::string HashName(const std::string& key);

}  // namespace torch_tpu::runtime
