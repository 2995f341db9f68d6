// The disk cache holds native code that is loaded and run: it refuses a
// directory, subdirectory, manifest or entry that another user could write.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "runtime/disk_cache.h"

namespace torch_tpu::runtime {
namespace {

namespace fs = std::filesystem;

std::string TempDir(const char* name) {
  fs::path p = fs::temp_directory_path() / (std::string("torch_tpu_cache_safety_") + name);
  fs::remove_all(p);
  return p.string();
}

unsigned Mode(const std::string& path) {
  struct stat st;
  EXPECT_EQ(stat(path.c_str(), &st), 0) << path;
  return st.st_mode & 07777;
}

TEST(DiskCacheSafety, WhatItCreatesIsPrivate) {
  std::string dir = TempDir("private") + "/nested";
  DiskCache cache(dir, 1 << 20);
  ASSERT_TRUE(cache.enabled());
  cache.Store("k", "v");
  std::string sub = cache.Subdir("prefetch");
  ASSERT_EQ(sub, dir + "/prefetch");
  cache.AppendToManifest(sub + "/m.list", ManifestRecord("k", "f.xc"));
  EXPECT_EQ(Mode(dir), 0700u);
  EXPECT_EQ(Mode(sub), 0700u);
  EXPECT_EQ(Mode(cache.PathFor("k")), 0600u);
  EXPECT_EQ(Mode(sub + "/m.list"), 0600u);
  EXPECT_EQ(cache.ReadManifest(sub + "/m.list").size(), 1u);
  EXPECT_TRUE(cache.enabled());
}

TEST(DiskCacheSafety, WorldOrGroupWritableDirectoryIsRefused) {
  for (unsigned mode : {0777u, 0770u}) {
    std::string dir = TempDir("writable_dir");
    fs::create_directories(dir);
    chmod(dir.c_str(), mode);
    EXPECT_NE(UnsafeCacheReason(dir).find("writable"), std::string::npos);
    DiskCache cache(dir, 1 << 20);
    EXPECT_FALSE(cache.enabled());
    cache.Store("k", "v");
    EXPECT_TRUE(fs::is_empty(dir));
    EXPECT_FALSE(cache.Load("k").has_value());
  }
}

TEST(DiskCacheSafety, WritableParentIsRefusedUnlessSticky) {
  std::string parent = TempDir("writable_parent");
  fs::create_directories(parent);
  chmod(parent.c_str(), 0777);
  EXPECT_EQ(UnsafeCacheReason(parent + "/cache", true), "");  // absent: nothing to trust yet
  DiskCache refused(parent + "/cache", 1 << 20);
  EXPECT_FALSE(refused.enabled());
  chmod(parent.c_str(), 01777);  // like /tmp
  DiskCache accepted(parent + "/cache2", 1 << 20);
  EXPECT_TRUE(accepted.enabled());
}

TEST(DiskCacheSafety, WritableEntryTurnsTheCacheOff) {
  std::string dir = TempDir("writable_entry");
  DiskCache cache(dir, 1 << 20);
  cache.Store("a", "payload a");
  cache.Store("b", "payload b");
  chmod(cache.PathFor("a").c_str(), 0666);
  EXPECT_FALSE(cache.Load("a").has_value());
  EXPECT_FALSE(cache.enabled());
  EXPECT_FALSE(cache.Load("b").has_value());  // nothing more is trusted this run
  EXPECT_TRUE(fs::exists(cache.PathFor("a")));  // refused, not removed
}

TEST(DiskCacheSafety, WritableManifestOrSubdirIsRefused) {
  std::string dir = TempDir("writable_manifest");
  {
    DiskCache cache(dir, 1 << 20);
    std::string sub = cache.Subdir("prefetch");
    cache.AppendToManifest(sub + "/m.list", ManifestRecord("k", "f.xc"));
    chmod((sub + "/m.list").c_str(), 0622);
    EXPECT_TRUE(cache.ReadManifest(sub + "/m.list").empty());
    EXPECT_FALSE(cache.enabled());
  }
  chmod((dir + "/prefetch").c_str(), 0777);
  DiskCache cache(dir, 1 << 20);
  EXPECT_TRUE(cache.enabled());
  EXPECT_EQ(cache.Subdir("prefetch"), "");
  EXPECT_FALSE(cache.enabled());
}

TEST(DiskCacheSafety, DirectoryOfAnotherUserIsRefused) {
  if (getuid() != 0) GTEST_SKIP() << "needs root to give a directory away";
  std::string dir = TempDir("other_owner");
  fs::create_directories(dir);
  ASSERT_EQ(chown(dir.c_str(), 12345, 12345), 0);
  EXPECT_NE(UnsafeCacheReason(dir).find("owned by uid 12345"), std::string::npos);
  DiskCache cache(dir, 1 << 20);
  EXPECT_FALSE(cache.enabled());
}

}  // namespace
}  // namespace torch_tpu::runtime
