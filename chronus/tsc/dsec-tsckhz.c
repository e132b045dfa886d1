/* dsec-tsckhz: prints the host's TSC rate in kHz, measured against CLOCK_MONOTONIC_RAW.
 * A microVM under TCG reads the host's TSC and has no other clock to calibrate it against
 * (no PIT speaker gate, HPET or ACPI PM timer on QEMU's microvm machine); edge passes this
 * value as the guest kernel's tsc_early_khz. */
#include <stdint.h>
#include <stdio.h>
#include <time.h>
#include <x86intrin.h>

static int64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC_RAW, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int main(void)
{
	uint64_t best = 0;
	/* Three 20 ms windows; the median is robust to a preemption in one of them. */
	uint64_t khz[3];
	for (int i = 0; i < 3; i++) {
		int64_t t0 = now_ns();
		uint64_t c0 = __rdtsc();
		struct timespec d = { 0, 20000000 };
		nanosleep(&d, NULL);
		int64_t t1 = now_ns();
		uint64_t c1 = __rdtsc();
		khz[i] = (c1 - c0) * 1000000 / (uint64_t)(t1 - t0);
	}
	uint64_t a = khz[0], b = khz[1], c = khz[2];
	best = a > b ? (b > c ? b : (a > c ? c : a)) : (a > c ? a : (b > c ? c : b));
	printf("%llu\n", (unsigned long long)best);
	return best ? 0 : 1;
}
