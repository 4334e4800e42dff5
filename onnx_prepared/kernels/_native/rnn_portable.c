/* The recurrence in portable C (the oracle the ISA variants are tested against). */
#define RNN_ENTRY rnn_run_portable
#define RNN_PROJECT rnn_project_portable
#include "rnn_step.inc"
