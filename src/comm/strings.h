// Text between ranks, on top of a Group's collectives: what a job's ranks say to each other
// outside the numbers (a server's requests, the lines a data-parallel replica printed).
// Collective: every rank of the group calls them in the same order.
#pragma once
#include <string>
#include <vector>

#include "comm/group.h"

namespace meshtrain::comm {

// Rank `root`'s `text` on every rank (the others' `text` is ignored).
std::string broadcast_string(Group& g, const std::string& text, int root);
// Every rank's `text`, in rank order.
std::vector<std::string> gather_strings(Group& g, const std::string& text);

}  // namespace meshtrain::comm
