// Text put into HTML and SVG: every string that did not come from this program (a path, a model
// name from a metrics file) is escaped, so that a run directory named `a<b&"c` shows as itself
// and never as markup.
#pragma once

#include <string>
#include <string_view>

namespace l3::report {

// `&`, `<`, `>`, `"` and `'` as character references: safe in element text and in attribute
// values (double- or single-quoted). Control characters other than tab and newline, which HTML
// does not allow, become U+FFFD; invalid UTF-8 is left to the browser (it shows U+FFFD).
[[nodiscard]] std::string escape_html(std::string_view text);

}  // namespace l3::report
