// Every NDWV_ environment variable, declared once: name, type, default, range, meaning.
// Values are read and checked once, at the first use; a bad value is refused with a message that
// names the variable and what it accepts (see Load()).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace ndwv::base {

enum class SettingType { Integer, Boolean, Choice, String };

struct SettingInfo {
  const char* name;
  SettingType type;
  const char* default_value;
  int64_t min, max;      // Integer
  const char* choices;   // Choice: comma-separated
  // String: any text (its default may be empty)
  const char* meaning;
};

struct Settings {
  int log_level;                 // 0 error .. 4 trace
  bool mpa_crc;                  // ask for and send MPA CRC-32C
  enum class Confirm { None, Writes, All } confirm;  // iWARP: requests a zero-length Read confirms
  uint32_t mpa_max_ulpdu;        // largest DDP segment we send
  uint32_t cm_timeout_ms;        // connection setup: TCP connect + MPA exchange
  uint32_t disconnect_timeout_ms;// how long a graceful close waits for the peer's close
  uint32_t work_threads;         // size of the shared work pool
  bool poll_progress;            // busy-polling CQ callers drive receive progress themselves
  std::string transports;        // offered transports, in order ("iwarp+roce")
  uint32_t iwarp_timeout_ms;     // TCP_USER_TIMEOUT of iWARP connections; 0: the kernel's
  // RoCE
  uint16_t roce_port;            // the one UDP port of port-0 connectors; 0: the kernel's choices
  uint32_t roce_connector_ports; // with roce_port 0: how many ports they take in turn
  uint32_t roce_cm_timeout_ms, roce_cm_retries, roce_timewait_ms;
  uint32_t roce_ack_timeout_ms, roce_keepalive_ms;
  uint8_t roce_retry_count, roce_rnr_timer, roce_rnr_retry;
  uint32_t roce_socket_buffer;   // receive and send buffer a port asks for, bytes
  bool roce_ecn;                 // datagrams ECN-capable; a CE mark draws a CNP
  std::string capture;           // pcap file of every packet sent and received; empty: off
  enum class Counters { Off, Exit, Signal } counters;  // when the counters report is written
  std::string counters_file;     // where; empty: stderr
};

// All declarations, in the order ndinfo prints them.
const std::vector<SettingInfo>& SettingTable();

// Like every static object of the library, the settings are never destroyed: a program's exit
// runs the static destructors while its other threads, and the library's, may still call in.
//
// The process's settings. Returns nullptr (after printing why to stderr) if a variable is set to
// a value its declaration does not accept.
const Settings* LoadSettings();
// The loaded settings, or the defaults if a value was refused (for code that runs only after
// NdStartup succeeded, or must work regardless).
const Settings& Config();

}  // namespace ndwv::base

// ndwv_settings_describe (include/ndwv/ndwv.h) lists this table for tools.
