// Chrome-trace recording (trace/trace.h), the step analysis and measured bubble
// (trace/timeline.h), the pipeline diagram (plot/timeline_svg.h) and `meshtrain timeline`.
//
//   Trace.WritesChromeTraceJson            object form, metadata names, X events: pid = rank,
//                                          tid = lane, ts/dur in us, args
//   Trace.OffByDefaultAndSpansRecordWhenOn nothing recorded while off; RAII spans when on
//   Trace.ConcurrentRecordingKeepsEverySpan two threads, every span kept
//   Trace.MergeConcatenatesRankFiles       two rank files -> one; a missing part is named
//   Trace.ReadRejectsInvalidFiles          missing, not JSON, no traceEvents
//   Timeline.BubbleOfSimulatedSchedulesIsExact  unit costs: (p-1)/(vm+p-1), bit for bit
//   Timeline.StepSelectionWindowAndRange   default last step; optimizer widens the drawn
//                                          range, not the window; comm placed by time
//   Timeline.ErrorsNameTheProblem          unknown step, no compute spans, malformed event
//   TimelineSvg.OneRowPerRankAndOneLabelPerBlock
//   TimelineSvg.InterleavedLabelsAndDenseTimelines
//   TimelineCli.MissingOrInvalidInputIsNamed
//   TimelineCli.DrawsASimulatedTrace
#include <gtest/gtest.h>

#include <filesystem>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_test_util.h"
#include "parallel/pp/schedule.h"
#include "parallel/pp/sim_trace.h"
#include "plot/timeline_svg.h"
#include "trace/timeline.h"
#include "trace/trace.h"

namespace meshtrain::trace::test_trace {
namespace {

namespace fs = std::filesystem;
namespace pp = parallel::pp;
using nlohmann::json;
using cli_test::read_file;

// A fresh temporary folder per test.
class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = cli_test::fresh_dir(fs::temp_directory_path() / ("meshtrain_trace_" + cli_test::kPid + "_" +
                                                               info->test_suite_name() + "_" + info->name()));
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

size_t count(const std::string& haystack, const std::string& needle) {
  size_t n = 0;
  for (size_t at = haystack.find(needle); at != std::string::npos; at = haystack.find(needle, at + 1)) n++;
  return n;
}

json parse_file(const std::string& path) { return json::parse(read_file(path)); }

std::vector<json> complete_events(const json& events) {
  std::vector<json> out;
  for (const json& e : events)
    if (e["ph"] == "X") out.push_back(e);
  return out;
}

json simulated(pp::ScheduleKind kind, int p, int m, int v, int step = 0) {
  pp::SimResult sim;
  Status s = pp::simulate(kind, p, m, v, 1, 2, &sim);
  EXPECT_TRUE(s.is_ok()) << s.message();
  return pp::simulated_trace(sim, step);
}

Timeline analyzed(const json& events, std::optional<int> step = std::nullopt) {
  Timeline t;
  Status s = analyze(events, step, &t);
  EXPECT_TRUE(s.is_ok()) << s.message();
  return t;
}

// ---- Recording ---------------------------------------------------------------------------

TEST(Trace, WritesChromeTraceJson) {
  TempDir dir;
  Tracer tracer;
  tracer.enable(3);
  tracer.record(Lane::kCompute, "F0", category::kForward, 10, 25, {{"step", 1}, {"mb", 0}, {"chunk", 0}});
  tracer.record(Lane::kComm, "all_reduce dp", category::kCollective, 20, 40, {{"axis", "dp"}, {"bytes", 4096}});
  ASSERT_TRUE(tracer.write(dir / "t.json").is_ok());

  json j = parse_file(dir / "t.json");
  ASSERT_TRUE(j.is_object());
  EXPECT_EQ(j["displayTimeUnit"], "ms");
  const json& events = j["traceEvents"];
  std::set<std::string> names;
  for (const json& e : events) {
    EXPECT_EQ(e["pid"], 3);
    if (e["ph"] == "M" && e["name"] != "process_sort_index")
      names.insert(e["name"].get<std::string>() + ":" + std::to_string(e.value("tid", -1)) + ":" +
                   e["args"]["name"].get<std::string>());
  }
  EXPECT_EQ(names,
            (std::set<std::string>{"process_name:0:rank 3", "thread_name:0:compute", "thread_name:1:comm"}));
  auto spans = complete_events(events);
  ASSERT_EQ(spans.size(), 2u);
  EXPECT_EQ(spans[0]["name"], "F0");
  EXPECT_EQ(spans[0]["cat"], "forward");
  EXPECT_EQ(spans[0]["tid"], 0);
  EXPECT_EQ(spans[0]["ts"], 10.0);
  EXPECT_EQ(spans[0]["dur"], 15.0);
  EXPECT_EQ(spans[0]["args"], (json{{"step", 1}, {"mb", 0}, {"chunk", 0}}));
  EXPECT_EQ(spans[1]["cat"], "collective");
  EXPECT_EQ(spans[1]["tid"], 1);
  EXPECT_EQ(spans[1]["args"]["axis"], "dp");
  EXPECT_EQ(spans[1]["args"]["bytes"], 4096);
}

TEST(Trace, OffByDefaultAndSpansRecordWhenOn) {
  Tracer local;
  EXPECT_FALSE(local.enabled());
  local.record(Lane::kCompute, "F0", category::kForward, 0, 1);
  EXPECT_TRUE(local.spans().empty());

  Tracer& tracer = Tracer::instance();
  ASSERT_FALSE(tracer.enabled());
  tracer.clear();
  { Tracer::Span span(Lane::kCompute, "ignored", category::kStep); }
  EXPECT_TRUE(tracer.spans().empty());

  tracer.enable(0);
  double before = Tracer::now_us();
  { Tracer::Span span(Lane::kComm, "send pp", category::kP2p, {{"axis", "pp"}, {"bytes", 8}}); }
  double after = Tracer::now_us();
  tracer.disable();
  auto spans = tracer.spans();
  tracer.clear();
  ASSERT_EQ(spans.size(), 1u);
  EXPECT_EQ(spans[0].lane, Lane::kComm);
  EXPECT_EQ(spans[0].name, "send pp");
  EXPECT_EQ(spans[0].category, "p2p");
  EXPECT_LE(before, spans[0].start_us);
  EXPECT_LE(spans[0].start_us, spans[0].end_us);
  EXPECT_LE(spans[0].end_us, after);
  EXPECT_EQ(spans[0].args["bytes"], 8);
}

TEST(Trace, ConcurrentRecordingKeepsEverySpan) {
  Tracer tracer;
  tracer.enable(0);
  auto work = [&](Lane lane) {
    for (int i = 0; i < 2000; ++i) tracer.record(lane, "x", category::kForward, i, i + 1);
  };
  std::thread compute(work, Lane::kCompute), comm(work, Lane::kComm);
  compute.join();
  comm.join();
  auto spans = tracer.spans();
  ASSERT_EQ(spans.size(), 4000u);
  int on_comm = 0;
  for (const auto& s : spans) on_comm += s.lane == Lane::kComm;
  EXPECT_EQ(on_comm, 2000);
}

TEST(Trace, MergeConcatenatesRankFiles) {
  TempDir dir;
  std::vector<std::string> parts;
  for (int rank = 0; rank < 2; ++rank) {
    Tracer tracer;
    tracer.enable(rank);
    double t0 = 100 * rank;
    tracer.record(Lane::kCompute, "F0", category::kForward, t0, t0 + 10, {{"step", 0}, {"mb", 0}});
    tracer.record(Lane::kCompute, "B0", category::kBackward, t0 + 10, t0 + 30, {{"step", 0}, {"mb", 0}});
    parts.push_back(dir / ("t.json.rank" + std::to_string(rank)));
    ASSERT_TRUE(tracer.write(parts.back()).is_ok());
  }
  ASSERT_TRUE(merge_rank_files(parts, dir / "t.json").is_ok());
  json events;
  ASSERT_TRUE(read_trace(dir / "t.json", &events).is_ok());
  auto spans = complete_events(events);
  ASSERT_EQ(spans.size(), 4u);
  EXPECT_EQ(spans[0]["pid"], 0);
  EXPECT_EQ(spans[3]["pid"], 1);
  EXPECT_EQ(events.size(), parse_file(parts[0])["traceEvents"].size() * 2);
  EXPECT_EQ(analyzed(events).ranks.size(), 2u);

  Status missing = merge_rank_files({parts[0], dir / "t.json.rank7"}, dir / "u.json");
  ASSERT_FALSE(missing.is_ok());
  EXPECT_NE(missing.message().find("t.json.rank7"), std::string::npos) << missing.message();
}

TEST(Trace, ReadRejectsInvalidFiles) {
  TempDir dir;
  json events;
  auto fails = [&](const std::string& path, const std::string& needle) {
    Status s = read_trace(path, &events);
    ASSERT_FALSE(s.is_ok()) << needle;
    EXPECT_NE(s.message().find(needle), std::string::npos) << s.message();
  };
  fails(dir / "absent.json", "cannot open");
  cli_test::write_file(dir / "broken.json", "{\"traceEvents\": [");
  fails(dir / "broken.json", "not valid JSON");
  cli_test::write_file(dir / "other.json", "{\"events\": []}");
  fails(dir / "other.json", "no traceEvents");
  // The bare-array form Chrome also accepts.
  cli_test::write_file(dir / "array.json", "[{\"ph\": \"X\", \"ts\": 0, \"dur\": 1, \"pid\": 0}]");
  EXPECT_TRUE(read_trace(dir / "array.json", &events).is_ok());
  EXPECT_EQ(events.size(), 1u);
}

// ---- Analysis ----------------------------------------------------------------------------

TEST(Timeline, BubbleOfSimulatedSchedulesIsExact) {
  struct Case {
    pp::ScheduleKind kind;
    int v;
  };
  for (Case c : {Case{pp::ScheduleKind::kGpipe, 1}, Case{pp::ScheduleKind::k1F1B, 1},
                 Case{pp::ScheduleKind::kInterleaved, 2}}) {
    for (int p : {2, 4, 8}) {
      for (int m : {1, 4, 8, 16}) {
        if (c.kind == pp::ScheduleKind::kInterleaved && m % p != 0) continue;
        std::string name = pp::schedule_name(c.kind);
        name += " p=" + std::to_string(p) + " m=" + std::to_string(m);
        Timeline t = analyzed(simulated(c.kind, p, m, c.v));
        // Sums of whole microseconds are exact, and so is the division of equal ratios.
        EXPECT_EQ(t.bubble_fraction, double(p - 1) / (c.v * m + p - 1)) << name;
        EXPECT_DOUBLE_EQ(t.window_ms(), 3.0 * (c.v * m + p - 1)) << name;
        EXPECT_EQ(t.chunks, c.v) << name;
        ASSERT_EQ(t.ranks.size(), size_t(p)) << name;
        for (int r = 0; r < p; ++r) {
          EXPECT_EQ(t.ranks[r].rank, r);
          EXPECT_EQ(t.ranks[r].compute.size(), size_t(2 * c.v * m)) << name;
          EXPECT_DOUBLE_EQ(t.ranks[r].busy_ms, 3.0 * c.v * m) << name;
          EXPECT_DOUBLE_EQ(t.ranks[r].idle_ms, 3.0 * (p - 1)) << name;
        }
      }
    }
  }
}

// Moves every complete event by `us` (a later step of the same run).
json shifted(json events, double us) {
  for (json& e : events)
    if (e["ph"] == "X") e["ts"] = e["ts"].get<double>() + us;
  return events;
}

TEST(Timeline, StepSelectionWindowAndRange) {
  // Step 0 and step 1 (p = 2, m = 2, 1F1B: 9 ms windows), 20 ms apart; step 1 has an
  // optimizer span after its last backward and a whole-step span; both ranks all-reduce.
  json events = simulated(pp::ScheduleKind::k1F1B, 2, 2, 1, 0);
  for (json& e : shifted(simulated(pp::ScheduleKind::k1F1B, 2, 2, 1, 1), 20000)) events.push_back(e);
  std::vector<SpanRecord> extra0 = {
      {Lane::kCompute, "optimizer", category::kOptimizer, 29000, 31000, {{"step", 1}}},
      {Lane::kCompute, "step", category::kStep, 19000, 31500, {{"step", 1}}},
      {Lane::kComm, "all_reduce dp", category::kCollective, 27500, 29500, {{"axis", "dp"}, {"bytes", 64}}},
      {Lane::kComm, "all_reduce dp", category::kCollective, 7000, 8000, {{"axis", "dp"}, {"bytes", 64}}}};
  for (json& e : trace_events(0, extra0)) events.push_back(e);

  Timeline last = analyzed(events);
  EXPECT_EQ(last.step, 1);
  EXPECT_EQ(last.steps, (std::vector<int>{0, 1}));
  // Range: the whole-step span 19..31.5 ms; window: forward/backward 20..29 ms.
  EXPECT_DOUBLE_EQ(last.range_ms, 12.5);
  EXPECT_DOUBLE_EQ(last.window_start_ms, 1);
  EXPECT_DOUBLE_EQ(last.window_end_ms, 10);
  ASSERT_EQ(last.ranks.size(), 2u);
  const RankTimeline& r0 = last.ranks[0];
  // 2 forwards, 2 backwards and the optimizer; the whole-step span is not a block.
  ASSERT_EQ(r0.compute.size(), 5u);
  EXPECT_EQ(r0.compute.back().category, "optimizer");
  EXPECT_DOUBLE_EQ(r0.busy_ms, 6);  // the optimizer is outside the bubble's accounting
  EXPECT_DOUBLE_EQ(r0.idle_ms, 3);
  // Only the all-reduce inside step 1's range, in the range's milliseconds.
  ASSERT_EQ(r0.comm.size(), 1u);
  EXPECT_DOUBLE_EQ(r0.comm[0].start_ms, 8.5);
  EXPECT_DOUBLE_EQ(r0.comm[0].end_ms, 10.5);
  EXPECT_TRUE(last.ranks[1].comm.empty());
  EXPECT_DOUBLE_EQ(last.bubble_fraction, 1.0 / 3);

  Timeline first = analyzed(events, 0);
  EXPECT_EQ(first.step, 0);
  EXPECT_DOUBLE_EQ(first.range_ms, 9);
  ASSERT_EQ(first.ranks[0].comm.size(), 1u);
  EXPECT_DOUBLE_EQ(first.ranks[0].comm[0].start_ms, 7);
  EXPECT_EQ(first.ranks[0].compute.size(), 4u);
}

TEST(Timeline, ErrorsNameTheProblem) {
  Timeline t;
  auto fails = [&](const json& events, std::optional<int> step, const std::string& needle) {
    Status s = analyze(events, step, &t);
    ASSERT_FALSE(s.is_ok()) << needle;
    EXPECT_NE(s.message().find(needle), std::string::npos) << s.message();
  };
  json events = simulated(pp::ScheduleKind::kGpipe, 2, 4, 1, 3);
  fails(events, 5, "step 5 is not in the trace (its steps: 3)");
  fails(json::array(), std::nullopt, "no forward/backward spans");
  fails(json::object(), std::nullopt, "not an array");
  json comm_only = trace_events(0, {{Lane::kComm, "send", category::kP2p, 0, 1, {{"step", 0}}}});
  fails(comm_only, std::nullopt, "no forward/backward spans");
  json malformed = events;
  malformed.push_back({{"ph", "X"}, {"name", "F9"}, {"ts", "soon"}, {"dur", 1}, {"pid", 0}});
  fails(malformed, std::nullopt, "\"F9\") needs numeric ts");
}

// ---- Drawing -----------------------------------------------------------------------------

TEST(TimelineSvg, OneRowPerRankAndOneLabelPerBlock) {
  Timeline t = analyzed(simulated(pp::ScheduleKind::k1F1B, 4, 8, 1));
  std::string svg = plot::render_timeline_svg(t, "a note");
  EXPECT_TRUE(svg.starts_with("<svg"));
  EXPECT_TRUE(svg.ends_with("</svg>\n"));
  EXPECT_EQ(count(svg, "<rect class=\"row\""), 4u);
  EXPECT_EQ(count(svg, "<rect class=\"forward\""), 32u);
  EXPECT_EQ(count(svg, "<rect class=\"backward\""), 32u);
  EXPECT_EQ(count(svg, "class=\"label\""), 64u);
  EXPECT_EQ(count(svg, "comm-row"), 0u);  // no communication spans, no comm lane
  for (int r = 0; r < 4; ++r) EXPECT_NE(svg.find(">rank " + std::to_string(r) + "<"), std::string::npos);
  // Rank 0's row is on top.
  EXPECT_LT(svg.find(">rank 0<"), svg.find(">rank 3<"));
  for (int mb = 0; mb < 8; ++mb)
    EXPECT_EQ(count(svg, " class=\"label\">" + std::to_string(mb) + "<"), 8u) << "micro-batch " << mb;
  EXPECT_NE(svg.find("step 0: measured bubble 27.3%"), std::string::npos);
  EXPECT_NE(svg.find("a note"), std::string::npos);
  EXPECT_NE(svg.find(">time in step (ms)<"), std::string::npos);
  EXPECT_NE(svg.find(">idle (bubble)<"), std::string::npos);
}

TEST(TimelineSvg, InterleavedLabelsAndDenseTimelines) {
  Timeline t = analyzed(simulated(pp::ScheduleKind::kInterleaved, 2, 4, 2));
  std::string svg = plot::render_timeline_svg(t);
  EXPECT_EQ(count(svg, "<rect class=\"row\""), 2u);
  EXPECT_EQ(count(svg, "class=\"label\""), 32u);
  EXPECT_EQ(count(svg, " class=\"label\">3.1<"), 4u);  // F and B of mb 3, chunk 1, on both ranks
  // Chunk 0 forwards in the base blue (and its legend swatch), chunk 1 in a lighter shade.
  EXPECT_EQ(count(svg, "fill=\"#1f6fb4\""), 8u + 1);
  EXPECT_EQ(count(svg, "fill=\"#9abedd\""), 8u);

  // 8 ranks with 64 blocks each: every block drawn, the figure stays within bounds.
  Timeline dense = analyzed(simulated(pp::ScheduleKind::k1F1B, 8, 32, 1));
  std::string big = plot::render_timeline_svg(dense);
  EXPECT_EQ(count(big, "<rect class=\"row\""), 8u);
  EXPECT_EQ(count(big, "<rect class=\"forward\"") + count(big, "<rect class=\"backward\""), 8u * 64);
  EXPECT_EQ(count(big, "class=\"label\""), 8u * 64);  // even the short forwards keep "31"
  double width = std::stod(big.substr(big.find("width=\"") + 7));
  EXPECT_LE(width, 2500);
}

// ---- Command line ------------------------------------------------------------------------

TEST(TimelineCli, MissingOrInvalidInputIsNamed) {
  TempDir dir;
  auto timeline = [](const std::string& args) { return cli_test::run(cli_test::kBinary + " timeline " + args); };
  std::string out = " --out " + dir / "t.svg";
  cli_test::expect_failure(timeline(dir / "absent.json" + out),
                           {"meshtrain: error:", "cannot open", "absent.json"});
  cli_test::write_file(dir / "bad.json", "not json");
  cli_test::expect_failure(timeline(dir / "bad.json" + out), {"bad.json", "not valid JSON"});
  ASSERT_TRUE(write_trace(dir / "sim.json", simulated(pp::ScheduleKind::k1F1B, 2, 2, 1, 4)).is_ok());
  cli_test::expect_failure(timeline(dir / "sim.json" + " --step 9" + out),
                           {"step 9 is not in the trace (its steps: 4)"});
  cli_test::expect_failure(timeline(dir / "sim.json" + " --out " + dir / "t.pdf"),
                           {"--out must end in .svg or .png"});
  cli_test::expect_failure(timeline(out), {"either a TRACE file or --simulate"});
  cli_test::expect_failure(timeline("--simulate zb" + out), {"unknown schedule 'zb'"});
  EXPECT_FALSE(fs::exists(dir / "t.svg"));
}

TEST(TimelineCli, DrawsASimulatedTrace) {
  TempDir dir;
  ASSERT_TRUE(write_trace(dir / "sim.json", simulated(pp::ScheduleKind::k1F1B, 4, 8, 1, 2)).is_ok());
  auto r = cli_test::run(cli_test::kBinary + " timeline " + dir / "sim.json" + " --out " + dir / "out/t.svg");
  ASSERT_EQ(r.exit_code, 0) << cli_test::describe(r);
  EXPECT_NE(r.out.find("step 2 of "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("4 ranks, step window 33.000 ms"), std::string::npos) << r.out;
  for (int rank = 0; rank < 4; ++rank)
    EXPECT_NE(r.out.find("rank " + std::to_string(rank) + ": busy 24.000 ms, idle 9.000 ms"), std::string::npos)
        << r.out;
  EXPECT_NE(r.out.find("bubble: 0.2727"), std::string::npos) << r.out;
  std::string svg = read_file(dir / "out/t.svg");
  EXPECT_EQ(count(svg, "<rect class=\"row\""), 4u);
  EXPECT_EQ(count(svg, "class=\"label\""), 64u);

  // The same schedule straight from the simulator: the same numbers.
  auto sim = cli_test::run(cli_test::kBinary + " timeline --simulate 1f1b --pp 4 --micro-batches 8 --out " +
                           dir / "s.svg");
  ASSERT_EQ(sim.exit_code, 0) << cli_test::describe(sim);
  EXPECT_NE(sim.out.find("bubble: 0.2727"), std::string::npos) << sim.out;
  // The simulator's own spans are all schedule: no imbalance, no overhead.
  EXPECT_NE(sim.out.find("bubble explained: schedule 0.2727 + stage imbalance 0.0000 + overhead 0.0000"),
            std::string::npos)
      << sim.out;
  EXPECT_TRUE(fs::exists(dir / "s.svg"));
  // An older trace that does not say which schedule ran is drawn without the parts.
  EXPECT_EQ(r.out.find("bubble explained"), std::string::npos) << r.out;
  // 2bw in its steady state: p - 1 backwards idle per rank, 6 of 30 ms.
  auto two_bw = cli_test::run(cli_test::kBinary + " timeline --simulate 2bw --pp 4 --micro-batches 8 --out " +
                              dir / "b.svg");
  ASSERT_EQ(two_bw.exit_code, 0) << cli_test::describe(two_bw);
  EXPECT_NE(two_bw.out.find("4 ranks, step window 30.000 ms"), std::string::npos) << two_bw.out;
  EXPECT_NE(two_bw.out.find("bubble: 0.2000"), std::string::npos) << two_bw.out;
}

}  // namespace
}  // namespace meshtrain::trace::test_trace
