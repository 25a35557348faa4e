// `meshtrain timeline`'s picture: one training step as the pipeline diagram people draw by
// hand to explain schedules. Ranks are rows, rank 0 on top. Forward, backward and optimizer
// spans are coloured blocks labelled with their micro-batch ("mb.chunk" when the run
// interleaves v > 1 chunks, whose blocks also get lighter shades chunk by chunk); idle time
// stays white, so the bubble is the white area. A thin row under each rank shows its
// communication lane (collectives and point-to-point). Readable for 2-8 ranks and up to
// ~64 blocks per rank: the figure widens with the number of blocks, and a label that does
// not fit its block is left off (every block keeps a tooltip).
#pragma once
#include <string>

#include "trace/timeline.h"

namespace meshtrain::plot {

// The diagram as a self-contained SVG document. Structure tests may rely on: one
// <rect class="row"> per rank, one <rect class="CATEGORY"> per block (forward, backward,
// optimizer, collective, p2p, other), one <text class="label"> per labelled block.
// `note` goes under the title in grey (e.g. where the trace came from).
std::string render_timeline_svg(const trace::Timeline& timeline, const std::string& note = "");

}  // namespace meshtrain::plot
