// The fault table's harness (fault_table.h): sandboxes, cached runs, snapshots, one case's run.
#include "faults/fault_table.h"

#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <regex>
#include <sstream>

#include "common.h"
#include "train/run_dir.h"

namespace zof::faults {

using json = nlohmann::json;

std::string zof_binary() { return zof::test::zof_binary(); }
std::string assets_dir() { return zof::test::assets_dir(); }

std::string shell_quoted(const fs::path& p) {
  // Built piece by piece: GCC 12 warns (-Wrestrict, a false positive) on "'" + s + "'".
  std::string q = "'";
  q += p.string();
  q += '\'';
  return q;
}

void hold_lock(Sandbox& s, const fs::path& lock) {
  const std::string q = shell_quoted(lock);
  std::string cmd = "cd " + shell_quoted(s.root());
  cmd += " && (setsid flock -o ";
  cmd += q;
  cmd += " sleep 600 </dev/null >/dev/null 2>&1 & echo $! > holder.pid) && "
         "for i in $(seq 100); do flock -n ";
  cmd += q;
  cmd += " true || exit 0; sleep 0.05; done; exit 1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << "the lock holder did not start";
}

void release_lock(Sandbox& s) {
  const std::string cmd = "kill -- -$(cat " + shell_quoted(s.root() / "holder.pid") + ") 2>/dev/null";
  (void)std::system(cmd.c_str());
}

namespace {

std::string slurp(const fs::path& p);

}  // namespace

void reseal_run(const fs::path& run) {
  json j = json::parse(slurp(run / "run.json"));
  const std::string seal = zof::train::run_json_seal(j);
  if (j.contains("seal")) {
    j["seal"] = seal;
    std::ofstream(run / "run.json", std::ios::binary | std::ios::trunc) << j.dump(1);
  }
  for (const auto& e : fs::directory_iterator(run)) {
    const fs::path state = e.path() / "state.json";
    if (zof::train::checkpoint_step(e.path().filename().string()) < 0 || !fs::exists(state))
      continue;
    json st = json::parse(slurp(state));
    if (!st.contains("run_seal")) continue;
    st["run_seal"] = seal;
    std::ofstream(state, std::ios::binary | std::ios::trunc) << st.dump(1);
  }
}

namespace {

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

fs::path process_dir() {
  return fs::temp_directory_path() / ("zof_faults_" + std::to_string(::getpid()));
}

// Everything under root: each entry's kind and, for files, size and bytes (FIFOs, devices and
// symlinks are not opened).
std::map<std::string, std::string> snapshot(const fs::path& root) {
  std::map<std::string, std::string> s;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(root, fs::directory_options::none, ec);
       it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (ec) break;
    const fs::path& p = it->path();
    const std::string rel = p.lexically_relative(root).string();  // follows no symlink (a loop)
    const auto st = fs::symlink_status(p);
    if (fs::is_symlink(st)) {
      s[rel] = "link:" + fs::read_symlink(p).string();
    } else if (fs::is_directory(st)) {
      s[rel] = "dir";
    } else if (fs::is_regular_file(st)) {
      const std::string bytes = slurp(p);
      s[rel] = "file:" + std::to_string(bytes.size()) + ":" +
               std::to_string(std::hash<std::string>{}(bytes));
    } else {
      s[rel] = "special";
    }
  }
  return s;
}

bool under_any(const std::string& rel, const std::vector<std::string>& prefixes) {
  for (const auto& p : prefixes) {
    if (rel == p || rel.rfind(p + "/", 0) == 0) return true;
  }
  return false;
}

void copy_model(const fs::path& to) {
  const fs::path from = fs::path(assets_dir()) / "models" / "stories260K";
  fs::create_directories(to);
  for (const auto& e : fs::directory_iterator(from)) {
    if (!e.is_regular_file()) continue;
    fs::copy_file(e.path(), to / e.path().filename(), fs::copy_options::overwrite_existing);
    fs::permissions(to / e.path().filename(), fs::perms::owner_read | fs::perms::owner_write,
                    fs::perm_options::add);
  }
}

void write_text(const fs::path& p) {
  const std::string t = slurp(fs::path(assets_dir()) / "data" / "tinyshakespeare" / "input.txt");
  std::ofstream(p, std::ios::binary) << t.substr(0, 20000);
}

std::string short_run_flags(const fs::path& model, const fs::path& text) {
  return "--model " + shell_quote(model.string()) + " --task text --data " +
         shell_quote(text.string()) +
         " --steps 3 --batch 2 --seq-len 32 --eval-examples 4 --threads 1 --no-report";
}

// A finished run made once per process and set of extra flags, with its own model and text.
fs::path cached_run(const std::string& extra) {
  static std::map<std::string, fs::path> runs;
  if (auto it = runs.find(extra); it != runs.end()) return it->second;
  const fs::path base = process_dir() / ("run_cache_" + std::to_string(runs.size()));
  fs::remove_all(base);
  copy_model(base / "model");
  write_text(base / "text.txt");
  const std::string cmd = zof_binary() + " finetune " +
                          short_run_flags(base / "model", base / "text.txt") +
                          " --save-every 1 --out " + shell_quote((base / "run").string()) + " " +
                          extra + " >" + (base / "log").string() + " 2>&1 </dev/null";
  const int st = std::system(cmd.c_str());
  if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0))
    throw std::runtime_error("the fault table's run failed: " + cmd + "\n" + slurp(base / "log"));
  runs[extra] = base / "run";
  return base / "run";
}

// The process's directory (cached runs, sandboxes) goes when the tests end.
class Cleanup : public ::testing::Environment {
 public:
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(process_dir(), ec);
  }
};
[[maybe_unused]] const auto* const kCleanup = ::testing::AddGlobalTestEnvironment(new Cleanup);

}  // namespace

Sandbox::Sandbox(const std::string& name) : root_(process_dir() / ("case_" + name)) {
  fs::remove_all(root_);
  fs::create_directories(root_);
}

Sandbox::~Sandbox() {
  std::error_code ec;
  fs::permissions(root_, fs::perms::owner_all, fs::perm_options::add, ec);
  fs::remove_all(root_, ec);
}

fs::path Sandbox::model() {
  const fs::path m = root_ / "model";
  if (!fs::exists(m)) copy_model(m);
  return m;
}

fs::path Sandbox::text() {
  const fs::path t = root_ / "text.txt";
  if (!fs::exists(t)) write_text(t);
  return t;
}

fs::path Sandbox::run(const std::string& name, const std::string& extra_flags) {
  const fs::path dst = root_ / name;
  if (fs::exists(dst)) return dst;
  fs::copy(cached_run(extra_flags), dst, fs::copy_options::recursive);
  // The copy's options name this sandbox's model and text, so that it resumes from them.
  const fs::path m = model(), t = text();
  edit_json(dst / "run.json", [&](json& j) {
    j["options"]["model"] = m.string();
    j["options"]["data"] = t.string();
    j["options"]["out"] = dst.string();
  });
  return dst;
}

std::string Sandbox::read(const fs::path& p) const { return slurp(p); }

void Sandbox::write(const fs::path& p, const std::string& bytes) const {
  std::ofstream(p, std::ios::binary | std::ios::trunc) << bytes;
}

void Sandbox::edit_json(const fs::path& p, const std::function<void(json&)>& edit) const {
  json j = json::parse(slurp(p));
  edit(j);
  write(p, j.dump(1));
}

std::string Sandbox::run_flags() { return short_run_flags(model(), text()); }

void run_case(const Case& c) {
  ZOF_REQUIRE_PATH(assets_dir() + "/models/stories260K");
  ZOF_REQUIRE_PATH(assets_dir() + "/data/tinyshakespeare/input.txt");
  Sandbox sb(c.name);
  if (c.setup) c.setup(sb);
  std::string cmd = c.command;
  const std::pair<const char*, std::function<std::string()>> subs[] = {
      {"{M}", [&] { return shell_quote(sb.model().string()); }},
      {"{T}", [&] { return shell_quote(sb.text().string()); }},
      {"{S}", [&] { return shell_quote(sb.root().string()); }},
      {"{F}", [&] { return sb.run_flags(); }},
      {"{R}", [&] { return shell_quote(sb.run().string()); }},
      {"{A}", [&] { return shell_quote(assets_dir()); }}};
  for (const auto& [key, value] : subs) {
    for (size_t at; (at = cmd.find(key)) != std::string::npos;) cmd.replace(at, 3, value());
  }
  const auto before = snapshot(sb.root());
  const fs::path out = process_dir() / (c.name + ".out"), err = process_dir() / (c.name + ".err");
  const std::string full = "cd " + shell_quote(sb.root().string()) + " && timeout -k 5 " +
                           std::to_string(c.timeout_s) + " " + zof_binary() + " " + cmd + " >" +
                           out.string() + " 2>" + err.string() + " </dev/null";
  const int st = std::system(full.c_str());
  const int code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  const std::string so = slurp(out), se = slurp(err);
  fs::remove(out);
  fs::remove(err);
  SCOPED_TRACE("zof " + cmd + "\nstderr: " + se + "\nstdout (tail): " +
               so.substr(so.size() > 2000 ? so.size() - 2000 : 0));
  ASSERT_NE(code, 124) << "timed out after " << c.timeout_s << " s";
  EXPECT_EQ(code, c.code);
  const std::string prefix = "zof: error: ";
  ASSERT_EQ(se.rfind(prefix, 0), 0u) << "stderr does not start with '" << prefix << "'";
  ASSERT_FALSE(se.empty());
  EXPECT_EQ(se.find('\n'), se.size() - 1) << "stderr is not exactly one line";
  const std::string line = se.substr(prefix.size(), se.find('\n') - prefix.size());
  EXPECT_TRUE(std::regex_search(line, std::regex(c.message)))
      << "the message does not match /" << c.message << "/";
  if (cmd.find("--json") != std::string::npos) {
    const size_t end = so.find_last_not_of('\n');
    ASSERT_NE(end, std::string::npos) << "--json: no JSON line on stdout";
    const size_t start = so.rfind('\n', end);
    const std::string last = so.substr(start == std::string::npos ? 0 : start + 1, end + 1);
    json j;
    ASSERT_NO_THROW(j = json::parse(last)) << "--json: the last line is not JSON: " << last;
    EXPECT_EQ(j.value("error", std::string()), line) << last;
  }
  const auto after = snapshot(sb.root());
  for (const auto& [rel, what] : after) {
    if (under_any(rel, c.may_change)) continue;
    auto it = before.find(rel);
    if (it == before.end())
      ADD_FAILURE() << "created " << rel;
    else if (it->second != what)
      ADD_FAILURE() << "changed " << rel;
  }
  for (const auto& [rel, what] : before) {
    if (!under_any(rel, c.may_change) && !after.count(rel)) ADD_FAILURE() << "removed " << rel;
  }
  if (c.check) c.check(sb);
}

}  // namespace zof::faults
