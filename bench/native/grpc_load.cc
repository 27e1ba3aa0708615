// grpc_load: one light gRPC load client (one process, one channel, one call at a time).
//
// Why: the Python client processes of bench_grpc.py --processes burned about as much CPU per
// call as the server, on the same two cores, so 16 of them measured the clients as much as
// the server (issue 38 part 4). This one sends pre-serialized request bytes (protobuf made
// once by Python; no codegen here) over a gRPC C++ channel on loopback TCP and does nothing
// else per call but time it, so its CPU per call is a small fraction of the server's. The
// call is gRPC C++'s blocking unary call on raw bytes, the one the SDK's native channel
// (engine/client/native/grpc_channel.cc) makes: the calling thread polls its own socket.
//
// grpc_load TARGET METHOD REQUESTS [--seconds S] [--max-calls N] [--warmup W] [--start I]
//           [--latencies FILE] [--wait-go]
//   REQUESTS: the request messages, each as a 4-byte little-endian length and its bytes;
//   calls cycle through them from index I. --wait-go: after the warm-up print "ready" and
//   wait for a line on stdin before the measured calls (so many clients start together).
//   Stops after S seconds (at most 600) or N calls, whichever comes first.
// Prints one JSON line: calls, ok, errors, first_error, wall_s, cpu_user_s, cpu_sys_s,
// cpu_us_per_call (this process, every thread, measured calls only); with --latencies each
// call's latency in ms as float32, in call order. Exit 0 when it ran (failed calls are counted,
// not fatal), 2 on bad arguments or an unreadable file.
#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/codegen/client_unary_call.h>
#include <sys/resource.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

namespace {

constexpr double kMaxSeconds = 600.0;  // a load loop is bounded in time whatever it is told

int Usage(const std::string& why) {
  std::cerr << "grpc_load: " << why << "\nusage: grpc_load TARGET METHOD REQUESTS [--seconds S] "
               "[--max-calls N] [--warmup W] [--start I] [--latencies FILE] [--wait-go]\n";
  return 2;
}

bool ReadRequests(const std::string& path, std::vector<std::string>* out, std::string* why) {
  std::ifstream f(path, std::ios::binary);
  if (!f) {
    *why = "cannot read " + path;
    return false;
  }
  while (true) {
    unsigned char len[4];
    if (!f.read(reinterpret_cast<char*>(len), 4)) break;
    uint32_t n = len[0] | (len[1] << 8) | (len[2] << 16) | (uint32_t(len[3]) << 24);
    std::string msg(n, '\0');
    if (n > 0 && !f.read(&msg[0], n)) {
      *why = path + ": message " + std::to_string(out->size()) + " is cut short (" +
             std::to_string(n) + " bytes announced)";
      return false;
    }
    out->push_back(std::move(msg));
  }
  if (f.gcount() != 0) {  // 1-3 stray bytes after the last message
    *why = path + ": a partial length after message " + std::to_string(out->size());
    return false;
  }
  if (out->empty()) {
    *why = path + ": no request messages";
    return false;
  }
  return true;
}

double Seconds(const timeval& tv) { return tv.tv_sec + tv.tv_usec / 1e6; }

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) return Usage("TARGET, METHOD and REQUESTS are required");
  std::string target = argv[1], method_path = argv[2], requests_path = argv[3];
  double seconds = 5.0;
  long max_calls = -1, warmup = 20, start = 0;
  std::string latencies_path;
  bool wait_go = false;
  for (int i = 4; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    const char* v = nullptr;
    char* end = nullptr;
    if (a == "--wait-go") {
      wait_go = true;
      continue;
    }
    if ((v = value()) == nullptr) return Usage(a + " needs a value");
    if (a == "--seconds") {
      seconds = std::strtod(v, &end);
      if (*end != '\0' || !(seconds > 0) || seconds > kMaxSeconds)
        return Usage("--seconds must be in (0, 600], got " + std::string(v));
    } else if (a == "--max-calls" || a == "--warmup" || a == "--start") {
      long n = std::strtol(v, &end, 10);
      if (*end != '\0' || n < 0) return Usage(a + " must be a count >= 0, got " + v);
      (a == "--max-calls" ? max_calls : a == "--warmup" ? warmup : start) = n;
    } else if (a == "--latencies") {
      latencies_path = v;
    } else {
      return Usage("unknown option " + a);
    }
  }
  std::vector<std::string> requests;
  std::string why;
  if (!ReadRequests(requests_path, &requests, &why)) return Usage(why);

  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // its own connection
  auto channel = grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
  grpc::internal::RpcMethod method(method_path.c_str(), grpc::internal::RpcMethod::NORMAL_RPC);
  // The request bytes as gRPC slices, made once: a call only refs them.
  std::vector<grpc::ByteBuffer> buffers;
  buffers.reserve(requests.size());
  for (const auto& r : requests) {
    grpc::Slice slice(r.data(), r.size());
    buffers.emplace_back(&slice, 1);
  }
  size_t next = static_cast<size_t>(start) % buffers.size();
  long calls = 0, ok = 0;
  std::string first_error;
  auto call = [&]() -> bool {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    grpc::ByteBuffer response;
    grpc::Status status = grpc::internal::BlockingUnaryCall<grpc::ByteBuffer, grpc::ByteBuffer>(
        channel.get(), method, &ctx, buffers[next], &response);
    next = (next + 1) % buffers.size();
    if (!status.ok() && first_error.empty())
      first_error = std::to_string(status.error_code()) + ": " + status.error_message();
    return status.ok();
  };
  for (long i = 0; i < warmup; ++i) call();  // the connection, the server's caches
  first_error.clear();
  if (wait_go) {
    std::cout << "ready" << std::endl;
    std::string line;
    if (!std::getline(std::cin, line)) return 0;  // the driver went away: nothing to measure
  }
  std::vector<float> lat;
  lat.reserve(1 << 16);
  rusage r0, r1;
  getrusage(RUSAGE_SELF, &r0);
  auto t0 = std::chrono::steady_clock::now();
  auto stop = t0 + std::chrono::microseconds(static_cast<int64_t>(seconds * 1e6));
  auto now = t0;
  while (now < stop && (max_calls < 0 || calls < max_calls)) {
    bool good = call();
    auto after = std::chrono::steady_clock::now();
    lat.push_back(std::chrono::duration<float, std::milli>(after - now).count());
    now = after;
    ++calls;
    ok += good;
  }
  double wall = std::chrono::duration<double>(now - t0).count();
  getrusage(RUSAGE_SELF, &r1);
  double user = Seconds(r1.ru_utime) - Seconds(r0.ru_utime);
  double sys = Seconds(r1.ru_stime) - Seconds(r0.ru_stime);
  if (!latencies_path.empty()) {
    std::ofstream f(latencies_path, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(lat.data()),
            static_cast<std::streamsize>(lat.size() * sizeof(float)));
    if (!f) {
      std::cerr << "grpc_load: cannot write " << latencies_path << "\n";
      return 2;
    }
  }
  std::printf("{\"calls\": %ld, \"ok\": %ld, \"errors\": %ld, \"first_error\": %s, "
              "\"wall_s\": %.6f, \"cpu_user_s\": %.6f, \"cpu_sys_s\": %.6f, "
              "\"cpu_us_per_call\": %.3f}\n",
              calls, ok, calls - ok, first_error.empty() ? "null" : JsonString(first_error).c_str(),
              wall, user, sys, calls ? (user + sys) * 1e6 / calls : 0.0);
  return 0;
}
