// gradzip-bench output: a '#'-prefixed header, one table row per size and
// codec, an OK/FAILED footer (nccl-tests' layout), and an optional JSON list.
#pragma once

#include <string>
#include <vector>

#include "bench/allreduce/harness.h"

namespace gz::bench {

void print_header(const Options& o, int ranks, const std::string& transport_desc, const std::string& topology);
void print_row(const Row& r);
/// Prints the footer; returns true when every row passed.
bool print_footer(const std::vector<Row>& rows);
/// Writes rows as a JSON list of records. Throws IoError.
void write_json(const std::string& path, const std::vector<Row>& rows);
/// Appends one row as a line of JSON (the keys of write_json), flushed: a
/// sweep reads rows as they finish.
void append_jsonl(const std::string& path, const Row& row);

}  // namespace gz::bench
