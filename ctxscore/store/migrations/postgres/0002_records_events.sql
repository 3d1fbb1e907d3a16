-- ctxscore PostgreSQL store, version 2: layer records (fact ledger, profiles ...) and event logs.

-- Records keyed by (scope, kind, key): scope is a session id or a user id such as 'user:42'.
CREATE TABLE ctx_records (
    scope   text NOT NULL,
    kind    text NOT NULL,
    key     text NOT NULL,
    value   text NOT NULL,
    version integer NOT NULL,
    updated timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (scope, kind, key)
);

-- The last sequence number of each scope's log: appenders lock its row, so numbers are gap-free
-- and a reader of events(after=n) never misses an event committed later with a smaller number.
CREATE TABLE ctx_event_heads (
    scope    text PRIMARY KEY,
    last_seq bigint NOT NULL
);

CREATE TABLE ctx_events (
    scope   text NOT NULL,
    seq     bigint NOT NULL,
    data    text NOT NULL,
    created timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (scope, seq)
);
