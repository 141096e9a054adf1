-- Every request that carries an Idempotency-Key purges up to 100 expired
-- keys first (api_idem.c, hub_sql_idem_purge: created_at older than 24 h).
-- With only the primary key (scope, key), a purge that finds none, which
-- is the steady state since each lookup purges what has expired, read the
-- whole table (a day of every tenant's keys) on the API connections every
-- request shares.
CREATE INDEX idempotency_keys_created_at ON idempotency_keys (created_at);
