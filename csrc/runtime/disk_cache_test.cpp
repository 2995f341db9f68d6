#include "runtime/disk_cache.h"

#include <gtest/gtest.h>
#include <utime.h>

#include <filesystem>
#include <fstream>

namespace torch_tpu::runtime {
namespace {

namespace fs = std::filesystem;

std::string TempDir(const char* name) {
  fs::path p = fs::temp_directory_path() / (std::string("torch_tpu_disk_cache_") + name);
  fs::remove_all(p);
  return p.string();
}

TEST(DiskCache, StoreLoadAndKeyMismatch) {
  DiskCache cache(TempDir("basic"), 1 << 20);
  EXPECT_FALSE(cache.Load("k1").has_value());
  cache.Store("k1", "payload one");
  auto v = cache.Load("k1");
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(*v, "payload one");
  EXPECT_FALSE(cache.Load("k2").has_value());
  EXPECT_EQ(cache.hits, 1);
  EXPECT_EQ(cache.misses, 2);
}

TEST(DiskCache, DetectsCorruption) {
  std::string dir = TempDir("corrupt");
  DiskCache cache(dir, 1 << 20);
  cache.Store("key", std::string(1000, 'x'));
  for (const auto& e : fs::directory_iterator(dir)) {
    std::fstream f(e.path(), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-5, std::ios::end);
    f.put('y');
  }
  EXPECT_FALSE(cache.Load("key").has_value());
  EXPECT_EQ(cache.corrupted, 1);
  EXPECT_TRUE(fs::is_empty(dir));  // removed, will be rewritten
}

TEST(DiskCache, EvictsLeastRecentlyUsed) {
  std::string dir = TempDir("lru");
  DiskCache cache(dir, 2500);  // room for two 1000-byte entries
  cache.Store("a", std::string(1000, 'a'));
  cache.Store("b", std::string(1000, 'b'));
  // Make "a" older than "b", then use "a": "b" becomes the LRU entry.
  for (const auto& e : fs::directory_iterator(dir)) {
    struct utimbuf old_time {1000, 1000};
    utime(e.path().c_str(), &old_time);
  }
  ASSERT_TRUE(cache.Load("a").has_value());
  cache.Store("c", std::string(1000, 'c'));
  EXPECT_TRUE(cache.Load("a").has_value());
  EXPECT_FALSE(cache.Load("b").has_value());
  EXPECT_TRUE(cache.Load("c").has_value());
}

TEST(DiskCache, EmptyDirDisables) {
  DiskCache cache("", 1 << 20);
  EXPECT_FALSE(cache.enabled());
  cache.Store("k", "v");
  EXPECT_FALSE(cache.Load("k").has_value());
}

TEST(DiskCache, ManifestRoundTripAndTruncatedTail) {
  std::string dir = TempDir("manifest");
  fs::create_directories(dir);
  std::string path = dir + "/m.list";
  std::string odd = "0|add.Tensor|with space\nand newline|end";
  {
    std::ofstream out(path, std::ios::binary);
    out << ManifestRecord("0|zeros|f32|1", "aa.xc") << ManifestRecord(odd, "bb.xc")
        << ManifestRecord("1|mul|f32", "cc.xc").substr(0, 12);  // a killed writer's tail
  }
  auto records = ReadManifest(path);
  ASSERT_EQ(records.size(), 2u);
  EXPECT_EQ(records[0].first, "0|zeros|f32|1");
  EXPECT_EQ(records[0].second, "aa.xc");
  EXPECT_EQ(records[1].first, odd);
  EXPECT_EQ(records[1].second, "bb.xc");
  EXPECT_TRUE(ReadManifest(dir + "/missing.list").empty());
}

TEST(DiskCache, ReadEntryByPath) {
  std::string dir = TempDir("read_entry");
  DiskCache cache(dir, 1 << 20);
  cache.Store("the key", "the payload");
  auto entry = cache.ReadEntry(cache.PathFor("the key"));
  ASSERT_TRUE(entry.has_value());
  EXPECT_EQ(entry->first, "the key");
  EXPECT_EQ(entry->second, "the payload");
  EXPECT_FALSE(cache.ReadEntry(cache.PathFor("other")).has_value());
  EXPECT_EQ(cache.corrupted, 0);
}

}  // namespace
}  // namespace torch_tpu::runtime
