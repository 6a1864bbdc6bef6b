/* flexc bench machine: the limits every other benchmark is quoted against. */
#include "util.h"
#include "cli/cli.h"

#include <stdlib.h>

int bench_machine(int argc, char **argv)
{
    bool json = false;
    int64_t gemm = 1024;
    const cli_opt opts[] = {
        {"--json", CLI_FLAG, &json, "one JSON object per line"},
        {"--gemm", CLI_INT, &gemm, "square sgemm size (default 1024)"},
    };
    int rc = cli_parse("bench machine", "[--json] [--gemm N]", argc, argv, opts, 2, NULL, 0, NULL);
    if (rc != CLI_PARSE_OK)
        return rc == CLI_PARSE_HELP ? CLI_EXIT_OK : rc;
    if (gemm < 16 || gemm > 8192) {
        cli_error("bench machine: --gemm %lld must be in [16, 8192]", (long long)gemm);
        return CLI_EXIT_USAGE;
    }
    double peak = bench_fma_peak_gflops();
    double triad = bench_triad_gbs();
    double sgemm = bench_sgemm_gflops(false, gemm, gemm, gemm), blis = bench_sgemm_gflops(true, gemm, gemm, gemm);
    double region_us, barrier_us;
    bench_sync_us(&region_us, &barrier_us);
    int threads = fx_get_num_threads();
    const char *isa = fx_isa_name(fx_get_isa());
    const char *policy = getenv("OMP_WAIT_POLICY");
    if (json) {
        printf("{\"case\":\"machine\",\"threads\":%d,\"isa\":\"%s\",\"fma_peak_gflops\":%.1f,"
               "\"triad_gbs\":%.2f,\"sgemm_n\":%lld,\"sgemm_gflops\":%.1f,\"sgemm_peak_fraction\":%.3f,"
               "\"blis_sgemm_gflops\":%.1f,\"omp_wait_policy\":\"%s\",\"parallel_region_us\":%.2f,"
               "\"barrier_us\":%.2f}\n",
               threads, isa, peak, triad, (long long)gemm, sgemm, sgemm / peak, blis, policy ? policy : "",
               region_us, barrier_us);
    } else {
        printf("threads %d, path %s\n", threads, isa);
        printf("  fp32 FMA peak     %8.1f GFLOP/s\n", peak);
        printf("  triad bandwidth   %8.2f GB/s\n", triad);
        printf("  sgemm %lldx%lld    %8.1f GFLOP/s (%.0f%% of peak)\n", (long long)gemm, (long long)gemm, sgemm,
               100.0 * sgemm / peak);
        printf("  BLIS sgemm        %8.1f GFLOP/s (%.0f%% of peak, BLIS's own threads)\n", blis, 100.0 * blis / peak);
        printf("  parallel region   %8.2f us, barrier %.2f us (OMP_WAIT_POLICY %s)\n", region_us, barrier_us,
               policy ? policy : "unset");
    }
    return CLI_EXIT_OK;
}
