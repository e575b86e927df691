#include "bench/allreduce/options.h"

#include <getopt.h>

#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "comm/cost/cost_model.h"
#include "common/error.h"
#include "common/units.h"
#include "compressors/descriptor.h"
#include "compressors/spec.h"

namespace gz::bench {

std::vector<std::string> default_codecs() {
  std::vector<std::string> out;
  for (const CodecDescriptor* d : all_codecs()) out.emplace_back(d->bench_specs.front().spec);
  return out;
}

namespace {

// The registry as JSON, for tools that drive this binary without gradzip's
// Python extension (the sweep, run from a checkout): the fields of
// gradzip.codec_info() that they use.
void list_codecs() {
  auto str = [](std::string_view s) {  // names and specs: letters, digits and ":,=._" only
    return "\"" + std::string(s) + "\"";
  };
  std::string out = "[";
  for (const CodecDescriptor* d : all_codecs()) {
    out += (out.size() > 1 ? ",\n " : "") + std::string("{\"name\": ") + str(d->name) +
           ", \"id\": " + std::to_string(static_cast<int>(d->id)) +
           ", \"lossless\": " + (d->lossless ? "true" : "false") + ", \"sparse\": " +
           (d->hint.sparse ? "true" : "false") +
           ", \"allgather_up_to_ranks\": " + std::to_string(d->hint.allgather_up_to_ranks) + ", \"bench_specs\": [";
    for (std::size_t i = 0; i < d->bench_specs.size(); ++i)
      out += (i ? ", [" : "[") + str(d->bench_specs[i].label) + ", " + str(d->bench_specs[i].spec) + "]";
    out += "]}";
  }
  std::printf("%s]\n", out.c_str());
}

// JSON string of a value the user typed (a spec, checked: no control bytes).
std::string json_string(std::string_view s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

// --expand-grid, --parse-count, --parse-link: gradzip's own parsers (the
// spec grid of compressors/spec.cc, common/units.h) as JSON, for the tools
// that run without gradzip's Python extension (the sweep from a checkout),
// so that they never parse a second way. An error: the message, exit 2.
[[noreturn]] void print_parsed(char kind, const std::string& text) {
  std::string out;
  try {
    if (kind == 'G') {
      for (const std::string& spec : expand_spec_grid_as_written(text))
        out += (out.empty() ? "" : ", ") + json_string(spec);
      out = "[" + out + "]";
    } else if (kind == 'C') {
      out = std::to_string(units::parse_count(text));
    } else {
      const units::Link l = units::parse_link(text);
      out = "{\"rate_bps\": " + std::to_string(l.rate_bps) + ", \"delay_ns\": " + std::to_string(l.delay_ns) +
            "}";
    }
  } catch (const std::exception& e) {  // gz::Error (the grid) or std::invalid_argument (units)
    std::fprintf(stderr, "gradzip-bench: %s\n", e.what());
    std::exit(2);
  }
  std::printf("%s\n", out.c_str());
  std::exit(0);
}

std::string joined(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : ",") + s;
  return out;
}

void usage(FILE* f) {
  std::fprintf(f,
               "usage: gradzip-run -n N -- gradzip-bench [options]\n"
               "\n"
               "Compressed allreduce over N ranks, nccl-tests style: one row per size and codec.\n"
               "  --codecs LIST      comma-separated codec specs (default %s)\n"
               "  --sizes LIST       element counts with K/M/G suffixes (default 1M,4M,16M)\n"
               "  --transport T      one of: %s (default %s)\n"
               "  --algorithm A      one of: %s (default auto)\n"
               "  --segment BYTES    payload bytes per pipeline segment, K/M suffixes (default 1M)\n"
               "  --predict          also print the cost model's prediction (pred), its error, and the\n"
               "                     limit: max(link time, bytes the codec touches / copy bandwidth)\n"
               "  --link RATE        the link for --predict and auto, e.g. 1gbit, 10gbit,50us\n"
               "                     (default GRADZIP_LINK, which gradzip-run --link sets)\n"
               "  --iters N          timed iterations per row (default 5)\n"
               "  --warmup N         untimed iterations first (default 2)\n"
               "  --device D         cpu | cuda (default cpu; ranks may share a GPU over ucx)\n"
               "  --json FILE        also write the rows as a JSON list\n"
               "  --jsonl FILE       append each row to FILE as one JSON line when it finishes\n"
               "  --timeout S        seconds before a silent peer is an error (default GRADZIP_TIMEOUT_S or 60)\n"
               "  --list-codecs      print the codec registry as JSON and exit\n"
               "  --list-algorithms  print the allreduce algorithms (--algorithm's values) as JSON and exit\n"
               "  --expand-grid G, --parse-count N, --parse-link L\n"
               "                     print a spec grid's specs (as written), an element count or a link as\n"
               "                     gradzip parses them, as JSON, and exit (2 and the reason when malformed)\n"
               "Codecs: %s\n",
               joined(default_codecs()).c_str(), transport_names().c_str(), std::string(kDefaultTransport).c_str(),
               joined(allreduce_algorithm_names()).c_str(),
               std::string(codec_names()).c_str());
}

[[noreturn]] void bad(const std::string& msg) {
  std::fprintf(stderr, "gradzip-bench: %s\n\n", msg.c_str());
  usage(stderr);
  std::exit(2);
}

int parse_count(const char* s, const char* what) {
  char* end = nullptr;
  const long v = std::strtol(s, &end, 10);
  if (!*s || *end || v < 0 || v > 1000000) bad(std::string(what) + " must be an integer >= 0, got '" + s + "'");
  return static_cast<int>(v);
}

}  // namespace

std::size_t parse_size(const std::string& s) {
  try {
    return static_cast<std::size_t>(units::parse_count(s));  // the one parser (common/units.h)
  } catch (const std::invalid_argument& e) {
    GZ_THROW(InvalidArgument, e.what());
  }
}

std::size_t parse_bytes(const std::string& s) { return parse_size(s); }

Options parse_options(int argc, char** argv) {
  Options o;
  static const option longs[] = {{"codecs", required_argument, nullptr, 'c'},
                                 {"sizes", required_argument, nullptr, 's'},
                                 {"transport", required_argument, nullptr, 't'},
                                 {"algorithm", required_argument, nullptr, 'a'},
                                 {"iters", required_argument, nullptr, 'i'},
                                 {"warmup", required_argument, nullptr, 'w'},
                                 {"device", required_argument, nullptr, 'd'},
                                 {"json", required_argument, nullptr, 'j'},
                                 {"jsonl", required_argument, nullptr, 'l'},
                                 {"timeout", required_argument, nullptr, 'T'},
                                 {"list-codecs", no_argument, nullptr, 'L'},
                                 {"list-algorithms", no_argument, nullptr, 'A'},
                                 {"segment", required_argument, nullptr, 'S'},
                                 {"predict", no_argument, nullptr, 'P'},
                                 {"link", required_argument, nullptr, 'K'},
                                 {"expand-grid", required_argument, nullptr, 'G'},
                                 {"parse-count", required_argument, nullptr, 'C'},
                                 {"parse-link", required_argument, nullptr, 'N'},
                                 {"help", no_argument, nullptr, 'h'},
                                 {nullptr, 0, nullptr, 0}};
  try {
    for (int c; (c = getopt_long(argc, argv, "c:s:t:a:i:w:d:j:l:T:S:PK:h", longs, nullptr)) != -1;) {
      const std::string v = optarg ? optarg : "";
      switch (c) {
        case 'c':
          o.codecs = split_spec_list(v);
          for (const auto& spec : o.codecs) (void)parse_spec(spec);  // fail before any rank connects
          if (o.codecs.empty()) bad("--codecs is empty");
          break;
        case 's': {
          o.sizes.clear();
          std::stringstream ss(v);
          for (std::string item; std::getline(ss, item, ',');)
            if (!item.empty()) o.sizes.push_back(parse_size(item));
          if (o.sizes.empty()) bad("--sizes is empty");
          break;
        }
        case 't': o.transport = std::string(transport_descriptor(v).name); break;
        case 'a': o.algorithm = parse_algorithm(v); break;
        case 'i': o.iters = parse_count(optarg, "--iters"); break;
        case 'w': o.warmup = parse_count(optarg, "--warmup"); break;
        case 'd':
          if (v == "cpu") o.device = Device::Cpu;
          else if (v == "cuda") o.device = Device::Cuda;
          else bad("--device must be cpu or cuda");
          break;
        case 'j': o.json = v; break;
        case 'l': o.jsonl = v; break;
        case 'T': {
          char* end = nullptr;
          o.timeout_s = std::strtod(optarg, &end);
          if (*end || !(o.timeout_s > 0)) bad("--timeout must be a positive number of seconds");
          break;
        }
        case 'S':
          o.segment_bytes = parse_bytes(v);
          if (o.segment_bytes == 0) bad("--segment must be at least 1 byte");
          break;
        case 'P': o.predict = true; break;
        case 'K':
          (void)parse_link_model(v);  // fail before any rank connects
          o.link = v;
          break;
        case 'G': case 'C': case 'N': print_parsed(static_cast<char>(c), v);
        case 'h': usage(stdout); std::exit(0);
        case 'L': list_codecs(); std::exit(0);
        case 'A': {
          std::string out = "[";
          for (const std::string& name : allreduce_algorithm_names()) out += (out.size() > 1 ? ", \"" : "\"") + name + "\"";
          std::printf("%s]\n", out.c_str());
          std::exit(0);
        }
        default: usage(stderr); std::exit(2);
      }
    }
  } catch (const Error& e) {
    bad(e.what());
  }
  if (optind < argc) bad(std::string("unexpected argument '") + argv[optind] + "'");
  if (o.iters < 1) bad("--iters must be at least 1");
  return o;
}

}  // namespace gz::bench
