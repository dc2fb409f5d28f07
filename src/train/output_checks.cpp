// The checks on an output directory before anything is written there (run_dir.h): check_apart
// (not an input path, not inside one, not holding one), and an existing directory's entries
// (foreign_entries, check_empty_out) beside zof's own leftovers (remove_stale_tmp).
#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>

#include "train/run_dir.h"
#include "zof/error.h"

namespace zof::train {

// ---- paths ------------------------------------------------------------------------------------

namespace {

// The real path: symlinks of the part that exists resolved, ".." folded.
fs::path real_path(const fs::path& p) {
  std::error_code ec;
  fs::path r = fs::weakly_canonical(fs::absolute(p, ec), ec);
  return ec ? fs::absolute(p).lexically_normal() : r;
}

// Whether `inner` is `outer` or lies inside it (whole components).
bool within(const fs::path& inner, const fs::path& outer) {
  auto i = inner.begin(), o = outer.begin();
  for (; o != outer.end(); ++o, ++i) {
    if (o->empty()) continue;  // a trailing separator
    if (i == inner.end() || *i != *o) return false;
  }
  return true;
}

}  // namespace

void check_apart(const fs::path& out, const std::string& out_flag, const fs::path& input,
                 const std::string& in_flag) {
  if (out.empty() || input.empty()) return;
  const fs::path o = real_path(out), i = real_path(input);
  const std::string what = out_flag + " " + out.string();
  const std::string in = in_flag + " " + input.string();
  ZOF_CHECK(!(within(o, i) && within(i, o)),
            what + " is " + in + " (both are " + o.string() + "): writing there would overwrite " +
                "the input; choose another " + out_flag);
  ZOF_CHECK(!within(o, i), what + " lies inside " + in + " (" + o.string() +
                               "): writing there would mix with the input; choose an " +
                               out_flag + " outside it");
  ZOF_CHECK(!within(i, o), what + " holds " + in + " (" + i.string() +
                               "): writing there could overwrite the input; choose an " +
                               out_flag + " that does not contain it");
}

// ---- an output directory that already exists ------------------------------------------------

namespace {

// `NAME.tmp.PID` (write_file_atomic's temporary file): PID; else 0.
long tmp_pid(const std::string& name) {
  const size_t at = name.rfind(".tmp.");
  if (at == std::string::npos || at == 0 || at + 5 >= name.size() || name.size() - at > 16)
    return 0;
  const std::string digits = name.substr(at + 5);
  if (digits.find_first_not_of("0123456789") != std::string::npos) return 0;
  return std::atol(digits.c_str());
}

// A leftover of a zof process that is gone: its temporary file, or the lock file.
bool stale_tmp(const fs::directory_entry& e) {
  const long pid = tmp_pid(e.path().filename().string());
  std::error_code ec;
  return pid > 0 && e.is_regular_file(ec) && ::kill((pid_t)pid, 0) != 0 && errno == ESRCH;
}

}  // namespace

std::vector<std::string> foreign_entries(const fs::path& dir, size_t max) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if ((n == ".lock" && e.is_regular_file(ec)) || stale_tmp(e)) continue;
    names.push_back(n);
  }
  std::sort(names.begin(), names.end());
  if (names.size() > max) {
    const size_t more = names.size() - max;
    names.resize(max);
    names.push_back(std::to_string(more) + " more");
  }
  return names;
}

void remove_stale_tmp(const fs::path& dir) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (stale_tmp(e)) fs::remove(e.path(), ec);
}

void check_empty_out(const fs::path& out, const std::string& flag, const std::string& what) {
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(out, ec))) return;
  ZOF_CHECK(fs::is_directory(out, ec),
            flag + " " + out.string() + " exists and is not a directory; " + what +
                ": choose another " + flag);
  const std::vector<std::string> names = foreign_entries(out);
  if (names.empty()) return;
  std::string list;
  for (size_t i = 0; i < names.size(); ++i)
    list += (i == 0 ? "" : i + 1 == names.size() ? " and " : ", ") + names[i];
  throw Error(flag + " " + out.string() + " is not empty (it holds " + list + "); " + what +
              ", so that nothing there is overwritten: choose another " + flag);
}

}  // namespace zof::train
