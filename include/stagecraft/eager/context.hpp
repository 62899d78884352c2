// The thread's execution context: the one thread-local that dispatch reads per op call.
#pragma once

namespace stagecraft::detail {

struct TraceState;  // graph/ (a later stage)
struct TapeStack;   // autodiff/

/// Per-thread state that decides what an op call does besides computing.
struct Context {
  TraceState* trace = nullptr;  ///< non-null while a function is being traced
  TapeStack* tapes = nullptr;   ///< non-null while a gradient tape is recording
  int no_record = 0;            ///< depth of stop_recording guards
};

inline Context& context() {
  thread_local Context ctx;
  return ctx;
}

}  // namespace stagecraft::detail
