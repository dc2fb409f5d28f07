// The files zof reads from a user (flags' files, a model directory's config, tokenizer and
// weights): each one checked to be a regular file before it is opened, so that a FIFO cannot
// block, a device such as /dev/zero is never read and a directory is named as one.
#pragma once
#include <cstdint>
#include <string>

namespace zof {

// zof::Error unless `path` is a regular file zof may read, saying what it is instead (missing,
// a directory, a FIFO, a device, a socket, unreachable) and then `want`, the fix. `name` is how
// the message names the path ("--data FILE", or the path itself). Nothing is opened.
void check_regular_file(const std::string& name, const std::string& path, const std::string& want);

// The whole of `path` after check_regular_file, refused (naming the limit) when larger than
// max_bytes. Opened without blocking and checked again, so a file swapped for a FIFO cannot hang.
std::string read_input_file(const std::string& name, const std::string& path,
                            const std::string& want, uint64_t max_bytes);

// The most bytes zof reads from a model directory's JSON files (config.json, tokenizer.json, the
// weights' index, the tokenizer's configs): the largest real tokenizer.json is about 35 MB.
inline constexpr uint64_t kMaxModelJsonBytes = uint64_t(256) << 20;
std::string size_words(uint64_t bytes);  // "256 MiB"

// zof::Error unless `dir` is a model directory zof can read: it exists and is a directory, and
// each file zof reads or copies from it (config.json, the weights and their index, tokenizer.json
// and the tokenizer's other files, generation_config.json) is, where present, a regular file.
// `flag` ("--model"; may be empty) names where the path came from. A path that is not a
// directory must be a regular file that starts as a GGUF file does (Model::load reads it).
void check_model_dir(const std::string& flag, const std::string& dir);

}  // namespace zof
