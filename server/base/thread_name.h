#ifndef PACKSCHED_SERVER_BASE_THREAD_NAME_H_
#define PACKSCHED_SERVER_BASE_THREAD_NAME_H_

// Names the calling thread for ps, top and perf (Linux keeps 15 characters). A thread inherits
// its creator's name otherwise, so a stream worker started from a gRPC callback would show up as
// one of gRPC's threads.

#include <pthread.h>

#include <string>

namespace packsched {

inline void NameThisThread(const std::string& name) {
  pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
}

}  // namespace packsched

#endif  // PACKSCHED_SERVER_BASE_THREAD_NAME_H_
