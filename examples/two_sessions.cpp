// A host that splits its communicator in two and fine-tunes the same model on each half with a
// different seed, at the same time: the library works on the communicator it is given.
//
//   mpiexec -n 4 two_sessions DATASET_DIR OUTPUT_DIR
#include <mpi.h>

#include <cstdio>
#include <l3/l3.hpp>
#include <string>

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (argc < 3) {
    if (rank == 0) std::fprintf(stderr, "usage: two_sessions DATASET_DIR OUTPUT_DIR\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  const std::string data = argv[1];
  const std::string out = argv[2];

  const int half = rank % 2;  // two interleaved halves
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, half, rank, &comm);
  int exit_code = 0;
  try {
    l3::RunConfig config = l3::RunConfig::from_args(
        {"sft", "--model", "tiny", "--data", data, "--seq-len", "256", "--global-batch", "4",
         "--steps", "8", "--lr", "3e-3", "--log-level", "warn", "--no-progress"});
    config.set("seed", static_cast<std::int64_t>(1000 + half))
        .set("ckpt-dir", out + "/half-" + std::to_string(half));
    l3::Session session(comm, config);
    session.on_checkpoint([&](const l3::CheckpointInfo& c) {
      if (session.rank() == 0)
        std::printf("half %d: checkpoint %s (step %lld)\n", half, c.directory.c_str(),
                    static_cast<long long>(c.step));
    });
    const l3::RunSummary summary = session.run();
    if (session.rank() == 0 && summary.last_step) {
      std::printf("half %d: %lld steps on %d ranks, seed %s, final loss %.4f\n", half,
                  static_cast<long long>(summary.steps), session.size(), config.get("seed").c_str(),
                  summary.last_step->loss);
    }
  } catch (const l3::Error& e) {
    std::fprintf(stderr, "half %d, rank %d: %s\n", half, rank, e.what());
    exit_code = e.exit_code();
  }
  MPI_Comm_free(&comm);
  MPI_Finalize();
  return exit_code;
}
