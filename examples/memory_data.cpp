// A host that feeds training batches from memory (l3::DataSource) instead of HDF5 shards: here a
// synthetic task, "copy the digits after ':' in reverse", generated per step so that a restart
// from a checkpoint gets the same samples for the same step.
//
//   mpiexec -n 4 memory_data [STEPS]
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <l3/l3.hpp>
#include <memory>
#include <random>
#include <string>

namespace {

class ReverseDigits final : public l3::DataSource {
 public:
  explicit ReverseDigits(int documents_per_rank) : per_rank_(documents_per_rank) {}

  void fill(std::int64_t step, int rank, int /*ranks*/, l3::StepSamples& out) override {
    std::mt19937 random(static_cast<unsigned>(step * 7919 + rank));  // a function of (step, rank)
    std::uniform_int_distribution<int> digit('0', '9');
    for (int d = 0; d < per_rank_; ++d) {
      std::string digits;
      for (int i = 0; i < 6; ++i) digits += static_cast<char>(digit(random));
      l3::SftDocument document;
      for (const char c : digits + ":") {  // the prompt: not in the loss
        document.tokens.push_back(static_cast<unsigned char>(c));
        document.loss_mask.push_back(0);
      }
      for (auto c = digits.rbegin(); c != digits.rend(); ++c) {  // the answer: in the loss
        document.tokens.push_back(static_cast<unsigned char>(*c));
        document.loss_mask.push_back(1);
      }
      out.documents.push_back(std::move(document));
    }
  }

 private:
  int per_rank_;
};

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0;
  int size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const long steps = argc > 1 ? std::atol(argv[1]) : 40;
  int exit_code = 0;
  try {
    // 32 rows of 16 tokens per step over all ranks; each rank's documents fill its rows.
    const int rows = 32;
    l3::RunConfig config =
        l3::RunConfig::from_args({"sft", "--model", "tiny", "--seq-len", "16", "--global-batch",
                                  std::to_string(rows), "--steps", std::to_string(steps), "--lr",
                                  "1e-2", "--warmup", "4", "--log-level", "warn", "--no-progress"});
    l3::Session session(MPI_COMM_WORLD, config, std::make_shared<ReverseDigits>(rows / size));
    double first = 0;
    double last = 0;
    session.on_step([&](const l3::StepMetrics& m) {
      if (m.step == 1) first = m.loss;
      last = m.loss;
    });
    session.run();
    if (rank == 0) {
      std::printf("memory_data: %ld steps on %d ranks, loss %.3f -> %.3f\n", steps, size, first,
                  last);
    }
    if (!(last < first)) exit_code = 1;  // it must learn something
  } catch (const l3::Error& e) {
    std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
    exit_code = e.exit_code();
  }
  MPI_Finalize();
  return exit_code;
}
