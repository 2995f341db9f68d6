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

#include <cstdint>
#include <optional>
#include <string>

namespace torch_tpu::runtime {

class DiskCache {
 public:
  // `dir` empty: disabled.
  DiskCache(std::string dir, uint64_t max_bytes);
  bool enabled() const { return !dir_.empty(); }
  const std::string& dir() const { return dir_; }

  std::optional<std::string> Load(const std::string& key);
  void Store(const std::string& key, const std::string& payload);

  int64_t hits = 0;
  int64_t misses = 0;
  int64_t corrupted = 0;

 private:
  std::string PathFor(const std::string& key) const;
  void Evict();
  std::string dir_;
  uint64_t max_bytes_;
  bool warned_ = false;
};

uint64_t Fnv1a64(const std::string& data, uint64_t seed = 1469598103934665603ULL);

}  // namespace torch_tpu::runtime
