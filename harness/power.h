/*
 * power.h: `tokgate power SPEC` (harness/power.c): the smallest calibrated
 * perturbation per stage kind that the token gate and stage replay detect
 * (docs/localize.md, "Power").
 */
#ifndef TG_POWER_H
#define TG_POWER_H

/* The command: argv[1] is "power". Prints a table and POWER.STAGE.GATE /
 * POWER.STAGE.REPLAY keys. Returns 0, or 2 on a usage, input or arm error. */
int power_main(int argc, char **argv);

#endif
