// A piece of text fit to quote in an error message: short, on one line, and
// with every byte that is not printable ASCII written as \xNN, so that a
// 100 MB line or a binary file cannot flood or garble the terminal.
//
//   accel::Excerpt("--num_processes=2")        // "\"--num_processes=2\""
//   accel::Excerpt(std::string(1e8, 'x'))      // "\"xxx...xxx\" (the first
//                                              //  60 of 100000000 bytes)"
//   accel::Excerpt("\x7f" "ELF\x02")           // "\"\\x7fELF\\x02\""
//   accel::Shown("--epochs")                   // "--epochs", as it is
//   accel::IsUtf8("caf\xc3\xa9")                // true; "\xff" false
//   accel::ClosestName("epoch", {"epochs", "seed"})  // "epochs"
#pragma once

#include <algorithm>
#include <cstdio>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace accel {

inline std::string Excerpt(std::string_view text, size_t max_bytes = 60) {
  std::string quoted = "\"";
  const std::string_view shown = text.substr(0, max_bytes);
  for (const char c : shown) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte >= 0x20 && byte < 0x7f && c != '"' && c != '\\') {
      quoted += c;
    } else if (c == '"' || c == '\\') {
      quoted += '\\';
      quoted += c;
    } else {
      char escaped[5];
      std::snprintf(escaped, sizeof(escaped), "\\x%02x", byte);
      quoted += escaped;
    }
  }
  quoted += '"';
  if (shown.size() < text.size()) {
    quoted += " (the first " + std::to_string(shown.size()) + " of " +
              std::to_string(text.size()) + " bytes)";
  }
  return quoted;
}

// Whether `text` is well-formed UTF-8 (no overlong forms, surrogates or
// code points past U+10FFFF).
inline bool IsUtf8(std::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    const auto lead = static_cast<unsigned char>(text[i]);
    size_t extra = 0;
    unsigned min = 0;
    unsigned code = 0;
    if (lead < 0x80) {
      ++i;
      continue;
    } else if (lead >= 0xc2 && lead <= 0xdf) {
      extra = 1, min = 0x80, code = lead & 0x1f;
    } else if (lead >= 0xe0 && lead <= 0xef) {
      extra = 2, min = 0x800, code = lead & 0x0f;
    } else if (lead >= 0xf0 && lead <= 0xf4) {
      extra = 3, min = 0x10000, code = lead & 0x07;
    } else {
      return false;
    }
    if (text.size() - i <= extra) return false;
    for (size_t k = 1; k <= extra; ++k) {
      const auto next = static_cast<unsigned char>(text[i + k]);
      if ((next & 0xc0) != 0x80) return false;
      code = (code << 6) | (next & 0x3f);
    }
    if (code < min || code > 0x10ffff || (code >= 0xd800 && code <= 0xdfff)) {
      return false;
    }
    i += extra + 1;
  }
  return true;
}

// The name among `known` closest to `name` (a misspelling: at most two
// letters, or a third of them, off), or "" when none is that close: for
// "did you mean --epochs?".
inline std::string ClosestName(std::string_view name,
                               const std::set<std::string>& known) {
  // Levenshtein distance, one row at a time.
  const auto distance = [](std::string_view a, std::string_view b) {
    std::vector<size_t> row(b.size() + 1);
    for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
    for (size_t i = 1; i <= a.size(); ++i) {
      size_t diagonal = row[0];
      row[0] = i;
      for (size_t j = 1; j <= b.size(); ++j) {
        const size_t above = row[j];
        row[j] = std::min({row[j] + 1, row[j - 1] + 1,
                           diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
        diagonal = above;
      }
    }
    return row[b.size()];
  };
  std::string best;
  size_t best_distance = std::max<size_t>(2, name.size() / 3) + 1;
  for (const std::string& candidate : known) {
    const size_t d = distance(name, candidate);
    if (d < best_distance) {
      best = candidate;
      best_distance = d;
    }
  }
  return best;
}

// `text` as it is when it is short printable ASCII, else Excerpt(text):
// for names and values that are usually plain.
inline std::string Shown(std::string_view text, size_t max_bytes = 60) {
  bool plain = text.size() <= max_bytes;
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    plain &= byte >= 0x20 && byte < 0x7f;
  }
  return plain ? std::string(text) : Excerpt(text, max_bytes);
}

}  // namespace accel
