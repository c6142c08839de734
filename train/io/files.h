// train/io/files.h — the file primitives checkpoints are built on: whole-file reads and
// writes that are on disk (fsync) before they return, and directory fsync for renames.
// Errors name the file (messages start with [checkpoint]: these files are checkpoints).
#pragma once

#include <string>

namespace ffn::train {

std::string read_bytes(const std::string& path);
// Creates or truncates `path`, writes a then b, fsyncs the file.
void write_file_synced(const std::string& path, const std::string& a, const std::string& b = {});
// fsync of a directory, so a rename inside it is durable (best effort).
void fsync_dir(const std::string& dir);

}  // namespace ffn::train
