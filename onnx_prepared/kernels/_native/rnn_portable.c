/* The recurrence in portable C (the oracle the ISA variants are tested against). */
#define RNN_ENTRY rnn_run_portable
#include "rnn_step.inc"
