/* flexc bench train --parallel fsdp|ddp: the distributed training step, overlapped against
   serialised communication (train_dist.c). */
#ifndef FX_BENCH_TRAIN_DIST_H
#define FX_BENCH_TRAIN_DIST_H

int bench_train_dist(int argc, char **argv);

#endif
