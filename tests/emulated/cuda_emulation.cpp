// The emulated grid: blocks one after the other (in a shuffled order), each block's threads as
// fibers switched cooperatively at barriers, in a shuffled order per phase.
#include "cuda_emulation.hpp"

#include <sys/mman.h>
#if !defined(__x86_64__)
#include <ucontext.h>
#endif

#include <array>
#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#define L3EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define L3EMU_ASAN 1
#endif
#endif
#ifdef L3EMU_ASAN
#include <sanitizer/common_interface_defs.h>
#endif

#if defined(__x86_64__)
// A fiber switch without a system call (ucontext's swapcontext saves the signal mask, one
// syscall per switch, which made emulated kernels spend most of their time in the kernel):
// push the callee-saved registers, swap stack pointers, pop, return into the other fiber.
extern "C" void l3emu_switch_stack(void** save_sp, void* load_sp);
asm(R"(
  .pushsection .text
  .globl l3emu_switch_stack
  .type l3emu_switch_stack, @function
l3emu_switch_stack:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size l3emu_switch_stack, .-l3emu_switch_stack
  .popsection
)");
#endif

namespace l3emu {

namespace {

#if defined(__x86_64__)
struct Context {
  void* sp = nullptr;
};
// A fresh fiber whose first switch-in "returns" into entry, with the stack aligned as at a call.
void prepare(Context& c, char* stack, std::size_t bytes, void (*entry)()) {
  auto top = reinterpret_cast<std::uintptr_t>(stack + bytes) & ~std::uintptr_t{15};
  auto* slot = reinterpret_cast<void**>(top);
  *--slot = nullptr;                              // entry's return address: it never returns
  *--slot = reinterpret_cast<void*>(entry);       // popped by `ret`
  for (int i = 0; i < 6; ++i) *--slot = nullptr;  // rbp, rbx, r12-r15
  c.sp = slot;
}
void switch_context(Context& from, Context& to) { l3emu_switch_stack(&from.sp, to.sp); }
#else
struct Context {
  ucontext_t uc{};
};
void prepare(Context& c, char* stack, std::size_t bytes, void (*entry)()) {
  getcontext(&c.uc);
  c.uc.uc_stack.ss_sp = stack;
  c.uc.uc_stack.ss_size = bytes;
  c.uc.uc_link = nullptr;
  makecontext(&c.uc, entry, 0);
}
void switch_context(Context& from, Context& to) { swapcontext(&from.uc, &to.uc); }
#endif

constexpr int kWarpSize = 32;
// Kernel frames are small; sanitizers need room for their redzones.
#ifdef L3EMU_ASAN
constexpr std::size_t kStackBytes = 512 * 1024;
#else
constexpr std::size_t kStackBytes = 128 * 1024;
#endif

enum class Wait { none, block_barrier, warp_barrier, done };

// The shuffles of the schedule: a small fast generator (xorshift64*), a fixed seed so that a
// failure repeats, and Fisher-Yates with a multiply-shift range reduction.
class ScheduleRng {
 public:
  std::uint32_t below(std::uint32_t n) {
    state_ ^= state_ >> 12U;
    state_ ^= state_ << 25U;
    state_ ^= state_ >> 27U;
    const auto r = static_cast<std::uint32_t>((state_ * 0x2545F4914F6CDD1DULL) >> 32U);
    return static_cast<std::uint32_t>((std::uint64_t{r} * n) >> 32U);
  }
  template <typename T>
  void shuffle(std::vector<T>& v) {
    for (std::size_t i = v.size(); i > 1; --i) {
      std::swap(v[i - 1], v[below(static_cast<std::uint32_t>(i))]);
    }
  }

 private:
  std::uint64_t state_ = 0x9E3779B97F4A7C15ULL;
};

// Fiber stacks from mmap: reserved, touched only as deep as a kernel goes.
class Stacks {
 public:
  Stacks() = default;
  Stacks(const Stacks&) = delete;
  Stacks& operator=(const Stacks&) = delete;
  ~Stacks() {
    if (base_ != nullptr) munmap(base_, count_ * kStackBytes);
  }
  void reserve(std::size_t count) {
    if (count <= count_) return;
    if (base_ != nullptr) munmap(base_, count_ * kStackBytes);
    void* p = mmap(nullptr, count * kStackBytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
    if (p == MAP_FAILED) throw std::runtime_error("emulated CUDA: cannot map fiber stacks");
    base_ = p;
    count_ = count;
  }
  char* stack(std::size_t i) const { return static_cast<char*>(base_) + i * kStackBytes; }

 private:
  void* base_ = nullptr;
  std::size_t count_ = 0;
};

struct Fiber {
  Context context;
  ThreadState state;
  Wait wait = Wait::none;
  char* stack = nullptr;
  void* fake_stack = nullptr;  // AddressSanitizer's bookkeeping across switches
};

struct Block {
  std::vector<Fiber> fibers;
  Context scheduler;
  const void* scheduler_stack = nullptr;
  std::size_t scheduler_stack_bytes = 0;
  Fiber* running = nullptr;
  const std::function<void()>* body = nullptr;
  std::vector<std::array<unsigned char, 16>> lanes;  // warp exchange slots: two per thread
  std::vector<std::uint32_t> exchange_round;         // shuffles done by each thread
  std::vector<float> shared;                         // dynamic shared memory
  std::string error;
};

thread_local Block* g_block = nullptr;
thread_local Stacks g_stacks;

void start_switch(void** fake_stack, const void* bottom, std::size_t bytes) {
#ifdef L3EMU_ASAN
  __sanitizer_start_switch_fiber(fake_stack, bottom, bytes);
#else
  (void)fake_stack, (void)bottom, (void)bytes;
#endif
}
void finish_switch(void* fake_stack, const void** old_bottom, std::size_t* old_bytes) {
#ifdef L3EMU_ASAN
  __sanitizer_finish_switch_fiber(fake_stack, old_bottom, old_bytes);
#else
  (void)fake_stack, (void)old_bottom, (void)old_bytes;
#endif
}

// From the running fiber back to the block's scheduler; returns when the scheduler resumes it.
void yield(Wait wait) {
  Block& block = *g_block;
  Fiber& fiber = *block.running;
  fiber.wait = wait;
  start_switch(&fiber.fake_stack, block.scheduler_stack, block.scheduler_stack_bytes);
  switch_context(fiber.context, block.scheduler);
  finish_switch(fiber.fake_stack, nullptr, nullptr);
}

void fiber_main() {
  Block& block = *g_block;
  finish_switch(nullptr, &block.scheduler_stack, &block.scheduler_stack_bytes);
  try {
    (*block.body)();
  } catch (const std::exception& e) {
    if (block.error.empty()) block.error = e.what();
  }
  Fiber& fiber = *block.running;
  fiber.wait = Wait::done;
  start_switch(nullptr, block.scheduler_stack, block.scheduler_stack_bytes);  // never resumed
  switch_context(fiber.context, block.scheduler);
  std::abort();  // unreachable: a finished fiber is never switched to again
}

std::string describe(const uint3& block_idx) {
  return "block (" + std::to_string(block_idx.x) + ", " + std::to_string(block_idx.y) + ", " +
         std::to_string(block_idx.z) + ")";
}

// Releases the barriers every live thread of their scope has reached. Throws when no thread
// can run: a barrier that some threads will never reach.
void release_barriers(Block& block, int threads) {
  bool any_live = false;
  bool all_at_block_barrier = true;
  bool any_at_block_barrier = false;
  bool any_done = false;
  for (const Fiber& f : block.fibers) {
    if (f.wait == Wait::done) {
      any_done = true;
      continue;
    }
    any_live = true;
    if (f.wait == Wait::block_barrier) any_at_block_barrier = true;
    if (f.wait != Wait::block_barrier) all_at_block_barrier = false;
  }
  if (!any_live) return;
  if (all_at_block_barrier) {
    if (any_done) {
      throw std::runtime_error(
          "emulated CUDA: __syncthreads reached by some threads of the block after others "
          "exited (undefined in CUDA)");
    }
    for (Fiber& f : block.fibers) f.wait = Wait::none;
    return;
  }
  bool released = false;
  const int warps = (threads + kWarpSize - 1) / kWarpSize;
  for (int w = 0; w < warps; ++w) {
    const int first = w * kWarpSize;
    const int last = std::min(first + kWarpSize, threads);
    int waiting = 0;
    int others = 0;
    for (int t = first; t < last; ++t) {
      const Wait wait = block.fibers[static_cast<std::size_t>(t)].wait;
      if (wait == Wait::warp_barrier) ++waiting;
      if (wait != Wait::warp_barrier) ++others;
    }
    if (waiting > 0 && others == 0) {
      for (int t = first; t < last; ++t) {
        if (block.exchange_round[static_cast<std::size_t>(t)] !=
            block.exchange_round[static_cast<std::size_t>(first)]) {
          throw std::runtime_error(
              "emulated CUDA: lanes of a warp meet in different shuffles (diverged)");
        }
        block.fibers[static_cast<std::size_t>(t)].wait = Wait::none;
      }
      released = true;
    }
  }
  if (released) return;
  if (any_at_block_barrier) {
    throw std::runtime_error(
        "emulated CUDA: some threads wait at __syncthreads while others of the block wait in a "
        "warp shuffle (divergent barrier)");
  }
  throw std::runtime_error(
      "emulated CUDA: a full-mask warp shuffle that some lanes of the warp never reach (exited "
      "or diverged)");
}

void run_block(Block& block, const dim3& grid, const dim3& block_dim, const uint3& block_idx,
               ScheduleRng& rng) {
  const int threads = static_cast<int>(block_dim.x * block_dim.y * block_dim.z);
  for (int t = 0; t < threads; ++t) {
    Fiber& f = block.fibers[static_cast<std::size_t>(t)];
    f.wait = Wait::none;
    f.fake_stack = nullptr;
    block.exchange_round[static_cast<std::size_t>(t)] = 0;
    f.state.block_idx = block_idx;
    f.state.block_dim = block_dim;
    f.state.grid_dim = grid;
    const auto u = static_cast<unsigned int>(t);
    f.state.thread_idx =
        uint3{u % block_dim.x, (u / block_dim.x) % block_dim.y, u / (block_dim.x * block_dim.y)};
    prepare(f.context, f.stack, kStackBytes, fiber_main);
  }
  std::fill(block.shared.begin(), block.shared.end(), std::nanf(""));
  std::vector<int> order(static_cast<std::size_t>(threads));
  std::iota(order.begin(), order.end(), 0);
  for (;;) {
    rng.shuffle(order);
    for (const int t : order) {
      Fiber& f = block.fibers[static_cast<std::size_t>(t)];
      if (f.wait != Wait::none) continue;
      block.running = &f;
      void* fake = nullptr;
      start_switch(&fake, f.stack, kStackBytes);
      switch_context(block.scheduler, f.context);
      finish_switch(fake, nullptr, nullptr);
      block.running = nullptr;
      if (!block.error.empty())
        throw std::runtime_error(block.error + " in " + describe(block_idx));
    }
    const bool all_done = std::all_of(block.fibers.begin(), block.fibers.begin() + threads,
                                      [](const Fiber& f) { return f.wait == Wait::done; });
    if (all_done) return;
    try {
      release_barriers(block, threads);
    } catch (const std::runtime_error& e) {
      throw std::runtime_error(std::string(e.what()) + " in " + describe(block_idx));
    }
  }
}

}  // namespace

ThreadState& current() {
  if (g_block == nullptr || g_block->running == nullptr) {
    throw std::logic_error("emulated CUDA: a built-in variable read outside a kernel");
  }
  return g_block->running->state;
}

void syncthreads() { yield(Wait::block_barrier); }

void misaligned_cast(const char* file, int line, std::uintptr_t address, std::size_t size,
                     std::size_t alignment) {
  std::array<char, 2 * sizeof(address)> digits{};
  auto* const end = std::to_chars(digits.data(), digits.data() + digits.size(), address, 16).ptr;
  throw std::runtime_error(std::string("emulated CUDA: misaligned address: ") + file + ":" +
                           std::to_string(line) + " casts 0x" + std::string(digits.data(), end) +
                           " to a pointer to " + std::to_string(size) + "-byte values aligned to " +
                           std::to_string(alignment) + " (a GPU would fault on the access)");
}

void warp_exchange(const void* value, void* result, std::size_t bytes, unsigned int mask,
                   int source_lane) {
  Block& block = *g_block;
  const ThreadState& s = current();
  const unsigned int threads = s.block_dim.x * s.block_dim.y * s.block_dim.z;
  const unsigned int linear = s.thread_idx.x + s.thread_idx.y * s.block_dim.x +
                              s.thread_idx.z * s.block_dim.x * s.block_dim.y;
  if (mask != 0xffffffffU) {
    throw std::runtime_error("emulated CUDA: only full-mask shuffles are modelled");
  }
  if (threads % kWarpSize != 0) {
    throw std::runtime_error("emulated CUDA: full-mask shuffle in a block of " +
                             std::to_string(threads) + " threads (not whole warps)");
  }
  if (source_lane < 0 || source_lane >= kWarpSize) {
    throw std::runtime_error("emulated CUDA: shuffle source lane out of range");
  }
  // Two slot sets used in turn: after the barrier every lane has deposited in this set, and the
  // other set's values were all read before any lane deposited here, so one barrier suffices.
  const unsigned int warp_first = linear / kWarpSize * kWarpSize;
  const std::size_t set = block.exchange_round[linear] % 2U;
  ++block.exchange_round[linear];
  std::memcpy(block.lanes[set * threads + linear].data(), value, bytes);
  yield(Wait::warp_barrier);  // every lane of the warp has deposited
  std::memcpy(
      result,
      block.lanes[set * threads + warp_first + static_cast<unsigned int>(source_lane)].data(),
      bytes);
}

void* dynamic_shared_memory() {
  if (g_block == nullptr) throw std::logic_error("emulated CUDA: shared memory outside a kernel");
  return g_block->shared.data();
}

void run_grid(dim3 grid, dim3 block_dim, std::size_t shared_bytes,
              const std::function<void()>& thread_body) {
  const std::size_t threads = std::size_t{block_dim.x} * block_dim.y * block_dim.z;
  if (threads == 0 || threads > 1024) {
    throw std::runtime_error("emulated CUDA: invalid block of " + std::to_string(threads) +
                             " threads");
  }
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.y > 65535 || grid.z > 65535) {
    throw std::runtime_error("emulated CUDA: invalid grid");
  }
  if (shared_bytes > 48 * 1024) {  // the default limit without an opt-in attribute
    throw std::runtime_error("emulated CUDA: " + std::to_string(shared_bytes) +
                             " bytes of dynamic shared memory (over 48 KiB)");
  }
  if (g_block != nullptr) throw std::logic_error("emulated CUDA: launch from inside a kernel");
  g_stacks.reserve(threads);
  Block block;
  block.fibers.resize(threads);
  for (std::size_t t = 0; t < threads; ++t) block.fibers[t].stack = g_stacks.stack(t);
  block.body = &thread_body;
  block.lanes.resize(2 * threads);
  block.exchange_round.resize(threads);
  block.shared.resize((shared_bytes + sizeof(float) - 1) / sizeof(float));
  std::vector<uint3> blocks;
  for (unsigned int z = 0; z < grid.z; ++z)
    for (unsigned int y = 0; y < grid.y; ++y)
      for (unsigned int x = 0; x < grid.x; ++x) blocks.push_back(uint3{x, y, z});
  static thread_local ScheduleRng rng;
  rng.shuffle(blocks);
  g_block = &block;
  try {
    for (const uint3& b : blocks) run_block(block, grid, block_dim, b, rng);
  } catch (...) {
    g_block = nullptr;
    throw;
  }
  g_block = nullptr;
}

}  // namespace l3emu
