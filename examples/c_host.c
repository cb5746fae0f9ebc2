/* A C host: configuration from arguments, a session on MPI_COMM_WORLD, progress through a step
 * callback, a checkpoint requested half-way, errors as codes with messages.
 *
 *   mpiexec -n 4 c_host DATASET_DIR CHECKPOINT_DIR
 */
#include <l3/l3.h>
#include <mpi.h>
#include <stdio.h>

static void on_step(const l3_step_metrics* m, void* user) {
  int rank = *(const int*)user;
  if (rank == 0)
    printf("step %lld/%lld loss %.4f\n", (long long)m->step, (long long)m->total_steps, m->loss);
}

static void on_checkpoint(const l3_checkpoint_info* c, void* user) {
  int rank = *(const int*)user;
  if (rank == 0) printf("checkpoint %s\n", c->directory);
}

int main(int argc, char** argv) {
  int provided = 0;
  int rank = 0;
  int status;
  int more = 1;
  l3_config* config = NULL;
  l3_session* session = NULL;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (argc < 3) {
    if (rank == 0) fprintf(stderr, "usage: c_host DATASET_DIR CHECKPOINT_DIR\n");
    MPI_Finalize();
    return 2;
  }
  {
    const char* args[] = {"sft",   "--model",     "tiny", "--data",         argv[1], "--ckpt-dir",
                          argv[2], "--seq-len",   "256",  "--global-batch", "4",     "--steps",
                          "6",     "--log-level", "warn", "--no-progress"};
    status = l3_config_from_args((int)(sizeof args / sizeof args[0]), args, &config);
  }
  if (status == L3_OK) status = l3_session_create(MPI_COMM_WORLD, config, &session);
  if (status == L3_OK) status = l3_session_on_step(session, on_step, &rank);
  if (status == L3_OK) status = l3_session_on_checkpoint(session, on_checkpoint, &rank);
  while (status == L3_OK && more) {
    status = l3_session_step(session, &more);
    if (l3_session_steps_done(session) == 3) l3_session_request_checkpoint(session);
  }
  if (status == L3_OK) {
    l3_checkpoint_info final_checkpoint;
    status = l3_session_checkpoint(session, &final_checkpoint);
    if (status == L3_OK && rank == 0) printf("final checkpoint %s\n", final_checkpoint.directory);
  }
  if (status != L3_OK) fprintf(stderr, "rank %d: error %d: %s\n", rank, status, l3_last_error());
  l3_session_free(session);
  l3_config_free(config);
  MPI_Finalize();
  return status;
}
