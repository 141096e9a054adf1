/*
 * rekey — `streaming-hub rekey`: re-seals every stored secret and
 * destination-headers blob under the current KEK (SPEC §11: secrets are
 * sealed with a key id, so the KEK can be rotated).  The procedure it is a
 * step of is in docs/deploy.md, "KEK rotation".
 *
 * It reads STREAMING_HUB_POSTGRES_DSN, STREAMING_HUB_KEK (the key it seals
 * with), STREAMING_HUB_KEK_PREVIOUS (the keys that open what is to be
 * re-sealed) and STREAMING_HUB_REKEY_BATCH (rows per transaction), walks
 * the subscriptions and the idempotency records in pages
 * (store_rekey.h), and writes each re-sealed row back with a
 * compare-and-set, one transaction per page.  It is idempotent (a value
 * already under the current KEK is left alone) and safe while hubs serve,
 * provided every hub already has the current KEK in its ring: hubs open
 * with any key of their ring, and a row a hub changes meanwhile keeps the
 * hub's value (sealed under the current KEK already).
 */
#ifndef HUB_REKEY_H
#define HUB_REKEY_H

/*
 * Runs the command with its arguments (after "rekey").  Prints one summary
 * line on stdout and logs as the hub does.  Returns the exit status: 0 when
 * nothing is left under another key, 1 when something is (a value no
 * configured key opens, or rows that kept changing) or on a database error,
 * 2 on a usage or configuration error.
 */
int hub_rekey_main(int argc, char **argv);

#endif
