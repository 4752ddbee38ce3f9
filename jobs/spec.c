/* jobs/spec.c - placeholder until the spec parser lands. */
typedef int kiln_spec_placeholder_t;
