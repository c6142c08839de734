// train/io/safetensors.h — the safetensors file format (8-byte header length, a JSON header
// with dtype/shape/data_offsets per tensor, raw little-endian data), with a CRC-32 per tensor
// in the header's metadata ("crc32:<name>") that loading verifies. Checkpoints
// (train/checkpoint.h) are made of these files.
//
// Note [Safetensors checks]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// Loading checks what the reference implementation checks, and says which check failed:
// the header length fits the file; the header is a JSON object; __metadata__, if present,
// maps strings to strings; every tensor has a dtype this reader takes (named when not), a
// shape of non-negative integers and data_offsets [begin, end] with begin <= end <= the
// data size and end - begin = the shape's bytes; and the tensors' byte ranges, in file
// order, tile the data exactly — from byte 0, each starting where the previous ended, the
// last ending at the end of the file (no overlap, no gap, nothing after).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/autograd.h"
#include "core/tensor.h"

namespace ffn::train {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

// The value tensors of named parameters (they share storage with the Vars).
NamedTensors values_of(const std::vector<std::pair<std::string, Var>>& vars);

uint32_t crc32(const void* data, size_t n, uint32_t crc = 0);

// Writes host copies of `tensors` (any device) to `path` (fsynced; not renamed).
void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata = {});
// Reads a safetensors file into host tensors, checking the layout and any per-tensor
// CRC-32 recorded in the metadata.
NamedTensors load_safetensors(const std::string& path,
                              std::map<std::string, std::string>* metadata = nullptr);
// "0123abcd": a CRC-32 as it is written into files.
std::string hex32(uint32_t v);

}  // namespace ffn::train
