// What nd_streams and tcp_streams share: their command line (bench/streams.sh passes both the
// same -n, -s and -t; -k is nd_streams' alone).
#pragma once

#include <getopt.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "scale_common.h"

namespace streams {

struct Options {
  unsigned connections = 128, size = 65536, inFlight = 4, seconds = 5, port = 0;
  int serveFd = -1;  // --serve FD: this process is the server; FD is its control socket
};

// `usage`: the program's text; `inFlight`: whether it takes -k.
inline Options Parse(int argc, char** argv, const char* usage, bool inFlight) {
  enum { kPort = 256, kServe };
  static const option longOptions[] = {{"port", required_argument, nullptr, kPort},
                                       {"serve", required_argument, nullptr, kServe},
                                       {"help", no_argument, nullptr, 'h'},
                                       {nullptr, 0, nullptr, 0}};
  Options o;
  int c;
  while ((c = getopt_long(argc, argv, inFlight ? "n:s:k:t:h" : "n:s:t:h", longOptions, nullptr)) != -1) {
    switch (c) {
      case 'n': o.connections = scale::ParseNumber("-n", optarg, 1, 100000); break;
      case 's': o.size = scale::ParseNumber("-s", optarg, 1, 16u << 20); break;
      case 'k': o.inFlight = scale::ParseNumber("-k", optarg, 1, 1024); break;
      case 't': o.seconds = scale::ParseNumber("-t", optarg, 1, 3600); break;
      case kPort: o.port = scale::ParseNumber("--port", optarg, 0, 65535); break;
      case kServe: o.serveFd = int(scale::ParseNumber("--serve", optarg, 0, 1 << 20)); break;
      case 'h': std::fputs(usage, stdout); std::exit(0);
      default: std::fputs(usage, stderr); std::exit(scale::kExitUsage);
    }
  }
  if (optind != argc) scale::Die(std::string("unexpected argument '") + argv[optind] + "'");
  return o;
}

}  // namespace streams
