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
//
// Entries are native code that is loaded and run, so, like ssh with a key
// file, the cache trusts only what no other user can write: the directory,
// its parents, its subdirectories and every entry must be owned by this user
// (or root) and not group- or world-writable (a parent may be a sticky
// directory such as /tmp). Anything else turns the whole disk cache off for
// the run, with one warning that says what to fix. What the cache creates
// is private to the user (directories 0700, files 0600).
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
  bool enabled() const { return !dir_.empty() && !refused_; }
  const std::string& dir() const { return dir_; }

  std::optional<std::string> Load(const std::string& key);
  void Store(const std::string& key, const std::string& payload);
  // The entry file that holds `key` (whether or not it exists).
  std::string PathFor(const std::string& key) const;
  // Reads an entry file by path: (stored key, payload) if intact; a damaged
  // entry is reported once and removed. Thread-safe; touches no counters
  // but `corrupted`.
  std::optional<std::pair<std::string, std::string>> ReadEntry(const std::string& path);

  // `name` under the cache directory, created private if missing: its path,
  // or "" (and the cache refused) when it is unsafe.
  std::string Subdir(const std::string& name);
  // ReadManifest below, if the manifest file is safe (else the cache is
  // refused); AppendToManifest writes one record with a single append,
  // creating the file private.
  std::vector<std::pair<std::string, std::string>> ReadManifest(const std::string& path);
  void AppendToManifest(const std::string& path, const std::string& record);

  int64_t hits = 0;
  int64_t misses = 0;
  std::atomic<int64_t> corrupted{0};

 private:
  void Evict();
  // False (and the cache off from now on, with one warning) if `path` exists
  // and another user could have written it.
  bool Trusts(const std::string& path);
  void Refuse(const std::string& path, const std::string& why);
  std::string dir_;
  std::atomic<bool> refused_{false};
  uint64_t max_bytes_;
  std::atomic<bool> warned_{false};
};

// Prefetch manifest: the executables one program used, in first-use order,
// as (in-memory cache key, entry file name) records. Records are
// length-prefixed, so keys may hold any byte; a truncated tail (a killed
// writer) ends the list.
std::vector<std::pair<std::string, std::string>> ReadManifest(const std::string& path);
std::string ManifestRecord(const std::string& key, const std::string& file);

// Why `path` (a cache directory or entry) must not be trusted, or "" if it is
// safe or absent: owned by another user (not root), or group- or
// world-writable. With `parents`, each parent directory is checked too
// (a sticky one, such as /tmp, may be world-writable).
std::string UnsafeCacheReason(const std::string& path, bool parents = false);

uint64_t Fnv1a64(const std::string& data, uint64_t seed = 1469598103934665603ULL);
// 32 hex digits (two seeded FNV-1a hashes): the file name stem for `key`.
std::string HashName(const std::string& key);

}  // namespace torch_tpu::runtime
