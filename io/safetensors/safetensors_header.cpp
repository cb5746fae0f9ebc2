#include "io/safetensors/safetensors_header.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "core/bounded_read.hpp"
#include "core/error.hpp"

namespace l3::safetensors {

using nlohmann::json;

namespace {

struct KnownDType {
  const char* name;
  bool supported;
  SafetensorsDType dtype;
};

constexpr KnownDType kDTypes[] = {
    {"BF16", true, SafetensorsDType::bf16},
    {"F16", true, SafetensorsDType::f16},
    {"F32", true, SafetensorsDType::f32},
    {"F64", false, {}},
    {"I64", false, {}},
    {"I32", false, {}},
    {"I16", false, {}},
    {"I8", false, {}},
    {"U64", false, {}},
    {"U32", false, {}},
    {"U16", false, {}},
    {"U8", false, {}},
    {"BOOL", false, {}},
    {"F8_E4M3", false, {}},
    {"F8_E5M2", false, {}},
    {"C64", false, {}},
};

[[noreturn]] void fail(const std::string& origin, const std::string& tensor,
                       const std::string& what) {
  throw core::bad_input(what, {.file = origin, .tensor = tensor});
}

std::uint64_t read_le64(std::span<const std::byte> bytes) {
  std::uint64_t value = 0;
  for (int i = 7; i >= 0; --i)
    value = (value << 8U) | std::to_integer<std::uint64_t>(bytes[static_cast<std::size_t>(i)]);
  return value;
}

SafetensorsTensor parse_entry(const std::string& name, const json& entry,
                              const std::string& origin) {
  if (!entry.is_object()) fail(origin, name, "its header entry is not an object");
  for (const char* key : {"dtype", "shape", "data_offsets"}) {
    if (!entry.contains(key))
      fail(origin, name, fmt::format("its header entry has no \"{}\"", key));
  }
  SafetensorsTensor t;
  t.name = name;
  const json& dtype = entry["dtype"];
  if (!dtype.is_string()) fail(origin, name, "\"dtype\" is not a string");
  const std::string dtype_text = dtype.get<std::string>();
  const auto* known = std::find_if(std::begin(kDTypes), std::end(kDTypes),
                                   [&](const KnownDType& k) { return dtype_text == k.name; });
  if (known == std::end(kDTypes))
    fail(origin, name, fmt::format("unknown dtype \"{}\"", dtype_text));
  if (!known->supported) {
    fail(origin, name,
         fmt::format("dtype {} is not supported (BF16, F16 and F32 are)", dtype_text));
  }
  t.dtype = known->dtype;

  const json& shape = entry["shape"];
  if (!shape.is_array()) fail(origin, name, "\"shape\" is not a list");
  std::uint64_t numel = 1;
  for (const json& d : shape) {
    if (!d.is_number_unsigned()) fail(origin, name, "\"shape\" holds something other than sizes");
    const auto size = d.get<std::uint64_t>();
    if (size > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) ||
        (size != 0 && numel > std::numeric_limits<std::uint64_t>::max() / 16 / size)) {
      fail(origin, name, "its shape is too large");
    }
    numel *= size;
    t.shape.push_back(static_cast<std::int64_t>(size));
  }

  const json& offsets = entry["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
      !offsets[1].is_number_unsigned()) {
    fail(origin, name, "\"data_offsets\" is not a pair of byte offsets");
  }
  t.begin = offsets[0].get<std::uint64_t>();
  t.end = offsets[1].get<std::uint64_t>();
  if (t.end < t.begin) fail(origin, name, "\"data_offsets\" end before they begin");
  const std::uint64_t bytes = numel * dtype_bytes(t.dtype);
  if (t.end - t.begin != bytes) {
    fail(origin, name,
         fmt::format("shape {} x {} is {} bytes but data_offsets [{}, {}) hold {}", shape.dump(),
                     dtype_text, bytes, t.begin, t.end, t.end - t.begin));
  }
  return t;
}

}  // namespace

std::size_t dtype_bytes(SafetensorsDType dtype) noexcept {
  return dtype == SafetensorsDType::f32 ? 4 : 2;
}

const char* dtype_name(SafetensorsDType dtype) noexcept {
  switch (dtype) {
    case SafetensorsDType::bf16:
      return "BF16";
    case SafetensorsDType::f16:
      return "F16";
    case SafetensorsDType::f32:
      return "F32";
  }
  return "?";
}

std::int64_t SafetensorsTensor::numel() const noexcept {
  std::int64_t n = 1;
  for (const std::int64_t d : shape) n *= d;
  return n;
}

const SafetensorsTensor* SafetensorsHeader::find(const std::string& name) const noexcept {
  const auto it = std::find_if(tensors.begin(), tensors.end(),
                               [&](const SafetensorsTensor& t) { return t.name == name; });
  return it == tensors.end() ? nullptr : &*it;
}

SafetensorsHeader parse_safetensors_header(std::span<const std::byte> prefix,
                                           std::uint64_t file_size, const std::string& origin) {
  if (file_size < 8 || prefix.size() < 8) {
    fail(origin, "", fmt::format("too short for a safetensors file ({} bytes)", file_size));
  }
  const std::uint64_t length = read_le64(prefix.first(8));
  if (length > kMaxSafetensorsHeader) {
    fail(
        origin, "",
        fmt::format("header length {} is over the 100 MB limit (not a safetensors file?)", length));
  }
  if (length > file_size - 8) {
    fail(origin, "",
         fmt::format("header length {} runs past the end of the file ({} bytes): truncated?",
                     length, file_size));
  }
  if (prefix.size() < 8 + length) {
    throw core::internal_error("safetensors header: not all of the header was given",
                               {.file = origin});
  }
  const auto* text = reinterpret_cast<const char*>(prefix.data() + 8);  // NOLINT: bytes as text
  const std::string_view header(text, static_cast<std::size_t>(length));

  // Duplicate names would be silently merged by the JSON library: caught while parsing.
  std::set<std::string> names;
  std::string duplicate;
  const json::parser_callback_t on_event = [&](int depth, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::key && depth == 1 &&
        !names.insert(parsed.get<std::string>()).second && duplicate.empty()) {
      duplicate = parsed.get<std::string>();
    }
    return true;
  };
  if (core::json_nesting_depth(header) > core::kMaxJsonDepth) {
    fail(origin, "", fmt::format("header nested deeper than {} levels", core::kMaxJsonDepth));
  }
  json document;
  try {
    document = json::parse(header, on_event);
  } catch (const json::exception& e) {
    fail(origin, "", fmt::format("header is not valid UTF-8 JSON: {}", e.what()));
  }
  if (!duplicate.empty()) fail(origin, duplicate, "the header names this tensor twice");
  if (!document.is_object()) fail(origin, "", "header is not a JSON object");

  SafetensorsHeader result;
  result.data_start = 8 + length;
  for (const auto& [name, entry] : document.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) fail(origin, "", "\"__metadata__\" is not an object");
      for (const auto& [key, value] : entry.items()) {
        if (!value.is_string())
          fail(origin, "", fmt::format(R"("__metadata__" value of "{}" is not a string)", key));
        result.metadata[key] = value.get<std::string>();
      }
      continue;
    }
    result.tensors.push_back(parse_entry(name, entry, origin));
  }

  // The byte ranges must tile the data buffer: no gap, no overlap, nothing past the end.
  const std::uint64_t buffer = file_size - result.data_start;
  std::sort(result.tensors.begin(), result.tensors.end(),
            [](const SafetensorsTensor& a, const SafetensorsTensor& b) {
              return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
            });
  std::uint64_t at = 0;
  std::string previous;
  for (const SafetensorsTensor& t : result.tensors) {
    if (t.end > buffer) {
      fail(origin, t.name,
           fmt::format("data_offsets [{}, {}) run past the data ({} bytes): truncated file?",
                       t.begin, t.end, buffer));
    }
    if (t.begin < at) fail(origin, t.name, fmt::format("its data overlaps '{}'", previous));
    if (t.begin > at) {
      fail(origin, t.name,
           fmt::format("{} bytes before its data belong to no tensor", t.begin - at));
    }
    at = t.end;
    previous = t.name;
  }
  if (at != buffer) {
    fail(origin, "",
         fmt::format("{} bytes at the end of the data belong to no tensor", buffer - at));
  }
  return result;
}

}  // namespace l3::safetensors
