// NCCL's errors as the trainer reports them (parallel/nccl_communicator.hpp): the call, the result
// code's text and NCCL's own last error, which says what actually failed.
#include <nccl.h>

#include <string>

#include "catch.hpp"
#include "core/error.hpp"
#include "parallel/nccl_communicator.hpp"

TEST_CASE("an NCCL error names the call, the result and NCCL's last error", "[gpu]") {
  ncclComm_t comm = nullptr;
  // Zero ranks: refused at once, before any device or network is touched (on a GPU too).
  const ncclResult_t result = ncclCommInitRank(&comm, 0, ncclUniqueId{}, 0);
  REQUIRE(result != ncclSuccess);
  const char* last_error = ncclGetLastError(nullptr);
  const std::string last = last_error != nullptr ? last_error : "";
#ifdef L3_CUDA_EMULATED
  CHECK(last == "emulated NCCL: ncclCommInitRank: invalid rank 0 of 0");
#endif
  std::string text;
  try {
    l3::parallel::check_nccl(result, "ncclCommInitRank (0 ranks)");
  } catch (const l3::core::Error& e) {
    text = e.what();
  }
  INFO(text);
  CHECK(text.starts_with(std::string("NCCL ncclCommInitRank (0 ranks): ") +
                         ncclGetErrorString(result)));
  if (last.empty()) {
    CHECK(text.find("NCCL_DEBUG=WARN") != std::string::npos);
  } else {
    CHECK(text.ends_with(": " + last));
  }
  CHECK_NOTHROW(l3::parallel::check_nccl(ncclSuccess, "nothing"));
}
