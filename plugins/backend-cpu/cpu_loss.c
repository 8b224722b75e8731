/*
 * cpu_loss.c — CPU kernels for the losses ops.
 */
#include "cpu.h"

em_status cpu_register_loss(em_registry *r) {
    (void)r;
    return EM_OK;
}
