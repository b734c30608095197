"""The keyed claim's pick on PostgreSQL as one function: ``controlplane_keyed_pick``.

``jobs.keyed_claims`` describes the steps (window, keys, counts, admission,
writes). Here they run inside the claim's own statement, as the plain
claim's ``controlplane_claimable_ids`` does: a worker's cycle writes its
completions and starts its keyed jobs in one statement and one commit, where
it took seven round trips (bench/flow_keys.py). Each statement in the
function takes a new snapshot, so the counts of running jobs, read after the
keys are locked, see every claim that held those keys before. They leave out
the jobs the same statement ends (``ending_tokens``: the leases its
completions are fenced by, one job's each): those run no more once it commits, and the
statement's own writes are not always visible to the function's statements
(a key limited to 1 waited out a retry for every job). Its plans are
kept for the session. Bitmap scans are off in it: the running keyed jobs'
index churns, and only a plain index scan marks its dead entries. So are
sequential scans: the keys' table grows from empty, and a plan made while
its statistics said 170 rows read all of its 1,000 rows to lock 32. And so
is JIT: the cost that turns a sequential scan away (where one is the only
way, as on the remote operations' table) made every plan look dear enough
to compile, 0.6 s a claim. Sorts are off as well: on statistics that still
described the queue as holding one row, the priority probe below sorted the
whole queue instead of reading its index's head (4 to 20 ms a claim behind a
50,000-job backlog).

Two steps skip work the usual drain does not need. The keys' rows are
locked first and only the missing ones made: an insert that first asked
"which of these exist?" read the whole keys' table on every claim (a hash
anti-join over its index). And each lane's best jobs are the window's own
turns unless a queued keyed job of the queue outranks the window's lowest
priority (``job_fair_priority_idx``, one probe): with one priority the
window already read each key's ready turns in order, and the 32 probes
that asked again were a fifth of the function.
"""

from django.db import migrations, models

CREATE_FUNCTION = r"""
CREATE OR REPLACE FUNCTION controlplane_keyed_pick(
    wanted int,
    ending_tokens uuid[],
    q text,
    ready_at timestamptz,
    size int,
    scan int,
    only_operations text[],
    local_operations text[],
    lim_names text[],
    lim_concurrency int[],
    lim_rate float8[],
    lim_burst float8[],
    OUT ids uuid[],
    OUT asked int,
    OUT turns int,
    OUT full_keys int,
    OUT held_back boolean,
    OUT retry_in float8,
    OUT at timestamptz
)
LANGUAGE plpgsql VOLATILE
SET enable_bitmapscan = off
SET enable_seqscan = off
SET enable_sort = off
SET jit = off
AS $$
DECLARE
    v_blocked text[] := '{}';
    -- the window: turns in turn order, each with its lane (fair key) and rank in the lane
    w_ids uuid[];
    w_keys text[];
    w_turns float8[];
    w_rank int[];
    w_lane int[];
    w_flow jsonb[];
    v_lowest int;
    -- the lanes, in order of their first turn: key, turns, candidates' range
    l_keys text[];
    l_turns int[];
    l_from int[];
    l_to int[];
    l_taken int[];
    -- candidates: each lane's best jobs, priority order within the lane
    c_ids uuid[];
    c_lane int[];
    c_turn float8[];
    c_keys jsonb[];
    c_started boolean[];
    -- the limited keys the candidates carry
    k_names text[];
    k_concurrency int[];
    k_rate float8[];
    k_capacity float8[];
    k_held boolean[];
    k_room int[];
    k_tokens float8[];
    k_stamp timestamptz[];
    k_spent boolean[];
    h_keys text[];
    v_new text[];
    h_tokens float8[];
    h_stamps timestamptz[];
    r_keys text[];
    r_counts int[];
    v_rounds int := 0;
    v_started int := 0;
    v_reordered boolean := false;
    v_fits boolean;
    v_ki int;
    v_pos int;
    v_wait float8;
    v_lane int;
    v_limited boolean;
    v_read_full boolean := false;
    v_stuck int;
BEGIN
    ids := '{}';
    asked := wanted;
    turns := 0;
    full_keys := 0;
    held_back := false;
    IF wanted <= 0 THEN
        RETURN;
    END IF;

    v_limited := cardinality(array_remove(lim_concurrency, NULL)) > 0;
    <<passes>>
    LOOP
        -- 1. Keys at their concurrency limit now, their jobs left out of the window: read in a
        -- second pass, when the first window's turns went to such keys past what the claim could
        -- still start. It reads every running keyed job, and a window of turns in order seldom
        -- meets a key twice.
        IF v_read_full THEN
            SELECT coalesce(array_agg(r.key), '{}') INTO v_blocked
              FROM (SELECT k.key, count(*) AS running
                      FROM controlplane_job j
                     CROSS JOIN LATERAL jsonb_array_elements_text(j.flow_keys) AS k(key)
                     WHERE j.status = 'running' AND j.fair_key IS NOT NULL AND NOT (
                           j.lease_token = ANY(ending_tokens)
                           AND NOT (j.has_dependents OR j.workflow_id IS NOT NULL))
                     GROUP BY k.key) AS r
             WHERE r.running >= lim_concurrency[coalesce(array_position(lim_names, r.key),
                                                         array_position(lim_names, split_part(r.key, ':', 1)))];
            full_keys := cardinality(v_blocked);
        END IF;

        -- The window: turns in order, each locked as it is read, SKIP LOCKED, by its row's
        -- address (a turn changed since this statement's snapshot has moved and is skipped).
        SELECT coalesce(array_agg(t.id ORDER BY t.fair_turn), '{}'),
               coalesce(array_agg(t.fair_key ORDER BY t.fair_turn), '{}'),
               coalesce(array_agg(t.fair_turn ORDER BY t.fair_turn), '{}'),
               coalesce(array_agg(t.flow_keys ORDER BY t.fair_turn), '{}'),
               min(t.priority)
          INTO w_ids, w_keys, w_turns, w_flow, v_lowest
          FROM (SELECT t.id, t.fair_key, t.fair_turn, t.flow_keys, t.priority
                  FROM (SELECT s.ctid
                          FROM (SELECT ctid, flow_keys FROM controlplane_job
                                 WHERE status = 'queued' AND fair_turn IS NOT NULL AND queue = q
                                   AND run_after <= ready_at
                                   AND (only_operations IS NULL OR operation = ANY(only_operations))
                                   AND (local_operations IS NULL OR operation NOT IN (
                                        SELECT name FROM controlplane_remoteoperation
                                         WHERE NOT deleted AND name <> ALL(local_operations)))
                                 ORDER BY fair_turn LIMIT scan) AS s
                         WHERE NOT (s.flow_keys ?| v_blocked)) AS c
                 CROSS JOIN LATERAL (SELECT id, fair_key, fair_turn, flow_keys, priority
                                       FROM controlplane_job
                                      WHERE ctid = c.ctid FOR UPDATE SKIP LOCKED) AS t
                 LIMIT size) AS t;
        turns := cardinality(w_ids);
        IF turns = 0 THEN
            RETURN;
        END IF;
        FOR i IN 1 .. turns LOOP
            v_lane := array_position(l_keys, w_keys[i]);
            IF v_lane IS NULL THEN
                l_keys := l_keys || w_keys[i];
                v_lane := cardinality(l_keys);
                l_turns[v_lane] := 0;
            END IF;
            l_turns[v_lane] := l_turns[v_lane] + 1;
            w_rank[i] := l_turns[v_lane];
            w_lane[i] := v_lane;
        END LOOP;

        -- Each lane's best jobs by priority (then turn), as many as its turns, locked. No queued
        -- keyed job of the queue outranks the window's lowest (job_fair_priority_idx): they are
        -- the window's own, as the window read each lane's ready turns in order.
        IF coalesce((SELECT priority FROM controlplane_job
                      WHERE status = 'queued' AND fair_turn IS NOT NULL AND queue = q
                      ORDER BY priority DESC, fair_turn DESC LIMIT 1), v_lowest) <= v_lowest THEN
            SELECT array_agg(u.id ORDER BY u.lane, u.turn), array_agg(u.lane ORDER BY u.lane, u.turn),
                   array_agg(u.turn ORDER BY u.lane, u.turn), array_agg(u.keys ORDER BY u.lane, u.turn)
              INTO c_ids, c_lane, c_turn, c_keys
              FROM unnest(w_ids, w_lane, w_turns, w_flow) AS u(id, lane, turn, keys);
        ELSE
            SELECT coalesce(array_agg(b.id ORDER BY l.lane, b.priority DESC, b.fair_turn), '{}'),
                   array_agg(l.lane ORDER BY l.lane, b.priority DESC, b.fair_turn),
                   array_agg(b.fair_turn ORDER BY l.lane, b.priority DESC, b.fair_turn),
                   array_agg(b.flow_keys ORDER BY l.lane, b.priority DESC, b.fair_turn)
              INTO c_ids, c_lane, c_turn, c_keys
              FROM unnest(l_keys, l_turns) WITH ORDINALITY AS l(key, turns, lane)
             CROSS JOIN LATERAL (SELECT id, fair_turn, flow_keys, priority FROM controlplane_job
                                  WHERE status = 'queued' AND fair_turn IS NOT NULL AND queue = q
                                    AND fair_key = l.key AND run_after <= ready_at
                                    AND (only_operations IS NULL OR operation = ANY(only_operations))
                                    AND (local_operations IS NULL OR operation NOT IN (
                                         SELECT name FROM controlplane_remoteoperation
                                          WHERE NOT deleted AND name <> ALL(local_operations)))
                                    AND NOT (flow_keys ?| v_blocked)
                                  ORDER BY priority DESC, fair_turn
                                  LIMIT l.turns FOR UPDATE SKIP LOCKED) AS b;
        END IF;
        IF cardinality(c_ids) = 0 THEN
            held_back := true;  -- turns without a job to give them: another claimer holds those
            RETURN;
        END IF;
        -- Arrays zipped by unnest below are made whole first: an element set on an empty
        -- array starts it at that subscript.
        c_started := array_fill(false, ARRAY[cardinality(c_ids)]);
        FOR i IN 1 .. cardinality(c_ids) LOOP
            IF l_from[c_lane[i]] IS NULL THEN
                l_from[c_lane[i]] := i;
                v_rounds := greatest(v_rounds, l_turns[c_lane[i]]);
            END IF;
            l_to[c_lane[i]] := i;
        END LOOP;

        -- 2. The limited keys the candidates carry: rows made on first use, locked SKIP LOCKED
        -- (a key another claimer holds is skipped this round: nobody waits on a key).
        SELECT coalesce(array_agg(s.key), '{}'), array_agg(lim_concurrency[s.pos]),
               array_agg(lim_rate[s.pos]),
               array_agg(coalesce(lim_burst[s.pos], greatest(1.0, coalesce(lim_rate[s.pos], 0.0))))
          INTO k_names, k_concurrency, k_rate, k_capacity
          FROM (SELECT DISTINCT e.key, coalesce(array_position(lim_names, e.key),
                                                array_position(lim_names, split_part(e.key, ':', 1))) AS pos
                  FROM unnest(c_keys) AS c(keys)
                 CROSS JOIN LATERAL jsonb_array_elements_text(c.keys) AS e(key)) AS s
         WHERE lim_concurrency[s.pos] IS NOT NULL OR lim_rate[s.pos] IS NOT NULL;
        IF cardinality(k_names) > 0 THEN
            k_held := array_fill(false, ARRAY[cardinality(k_names)]);
            k_tokens := array_fill(NULL::float8, ARRAY[cardinality(k_names)]);
            k_stamp := array_fill(NULL::timestamptz, ARRAY[cardinality(k_names)]);
            k_spent := array_fill(false, ARRAY[cardinality(k_names)]);
            SELECT coalesce(array_agg(f.key), '{}'), coalesce(array_agg(f.tokens), '{}'),
                   coalesce(array_agg(f.refilled_at), '{}')
              INTO h_keys, h_tokens, h_stamps
              FROM (SELECT key, tokens, refilled_at FROM controlplane_flowkey
                     WHERE key = ANY(k_names) FOR UPDATE SKIP LOCKED) AS f;
            -- A key not locked is new (its row made now, then locked) or held by another claimer
            -- (its row's insert does nothing and its lock is skipped again).
            IF cardinality(h_keys) < cardinality(k_names) THEN
                v_new := ARRAY(SELECT unnest(k_names) EXCEPT SELECT unnest(h_keys));
                INSERT INTO controlplane_flowkey (key, tokens, refilled_at, created_at)
                SELECT n.key, 0, NULL, statement_timestamp() FROM unnest(v_new) AS n(key)
                ON CONFLICT DO NOTHING;
                SELECT h_keys || coalesce(array_agg(f.key), '{}'),
                       h_tokens || coalesce(array_agg(f.tokens), '{}'),
                       h_stamps || coalesce(array_agg(f.refilled_at), '{}')
                  INTO h_keys, h_tokens, h_stamps
                  FROM (SELECT key, tokens, refilled_at FROM controlplane_flowkey
                         WHERE key = ANY(v_new) FOR UPDATE SKIP LOCKED) AS f;
            END IF;
            -- 3. The counts, in a statement of their own: its snapshot, taken after the locks,
            -- sees every claim that held these keys before.
            IF cardinality(array_remove(k_concurrency, NULL)) > 0 AND cardinality(h_keys) > 0 THEN
                SELECT array_agg(r.key), array_agg(r.running) INTO r_keys, r_counts
                  FROM (SELECT k.key, count(*)::int AS running
                          FROM controlplane_job j
                         CROSS JOIN LATERAL jsonb_array_elements_text(j.flow_keys) AS k(key)
                         WHERE j.status = 'running' AND j.fair_key IS NOT NULL
                           AND k.key = ANY(h_keys) AND NOT (
                               j.lease_token = ANY(ending_tokens)
                               AND NOT (j.has_dependents OR j.workflow_id IS NOT NULL))
                         GROUP BY k.key) AS r;
            END IF;
            FOR i IN 1 .. cardinality(k_names) LOOP
                v_pos := array_position(h_keys, k_names[i]);
                k_held[i] := v_pos IS NOT NULL;
                CONTINUE WHEN v_pos IS NULL;
                IF k_concurrency[i] IS NOT NULL THEN
                    k_room[i] := k_concurrency[i]
                                 - coalesce(r_counts[array_position(r_keys, k_names[i])], 0);
                END IF;
                IF k_rate[i] IS NOT NULL THEN
                    -- The bucket's refill (jobs.rate_limits.refill): never refilled starts full;
                    -- a stamp ahead of this clock adds nothing.
                    IF h_stamps[v_pos] IS NULL THEN
                        k_tokens[i] := k_capacity[i];
                        k_stamp[i] := ready_at;
                    ELSIF ready_at <= h_stamps[v_pos] THEN
                        k_tokens[i] := least(h_tokens[v_pos], k_capacity[i]);
                        k_stamp[i] := h_stamps[v_pos];
                    ELSE
                        k_tokens[i] := least(k_capacity[i], h_tokens[v_pos]
                            + extract(epoch FROM ready_at - h_stamps[v_pos]) * k_rate[i]);
                        k_stamp[i] := ready_at;
                    END IF;
                END IF;
            END LOOP;
        END IF;

        -- A window whose turns went to keys at their limit, more than the claim could spare:
        -- read those keys (step 1) and take the window again past them.
        EXIT passes WHEN v_read_full OR NOT v_limited OR turns < size;
        v_stuck := 0;
        FOR i IN 1 .. cardinality(c_ids) LOOP
            FOR j IN 0 .. jsonb_array_length(c_keys[i]) - 1 LOOP
                v_ki := array_position(k_names, c_keys[i] ->> j);
                IF v_ki IS NOT NULL AND k_held[v_ki] AND k_room[v_ki] <= 0 THEN
                    v_stuck := v_stuck + 1;
                    EXIT;
                END IF;
            END LOOP;
        END LOOP;
        EXIT passes WHEN v_stuck = 0 OR cardinality(c_ids) - v_stuck >= wanted;
        v_read_full := true;
        l_keys := NULL;
        l_turns := NULL;
        l_from := NULL;
        l_to := NULL;
        w_rank := NULL;
        w_lane := NULL;
        k_room := NULL;
        r_keys := NULL;
        r_counts := NULL;
        v_rounds := 0;
    END LOOP;

    -- 4. Admission: round-robin over the lanes, one turn each per round; a lane's turn
    -- goes to its first job whose every limited key has room and a whole token.
    <<rounds>>
    FOR t IN 1 .. v_rounds LOOP
        FOR l IN 1 .. cardinality(l_keys) LOOP
            EXIT rounds WHEN v_started >= wanted;
            CONTINUE WHEN l_from[l] IS NULL OR l_turns[l] < t;
            FOR i IN l_from[l] .. l_to[l] LOOP
                CONTINUE WHEN c_started[i];
                v_fits := true;
                FOR j IN 0 .. jsonb_array_length(c_keys[i]) - 1 LOOP
                    v_ki := array_position(k_names, c_keys[i] ->> j);
                    CONTINUE WHEN v_ki IS NULL;
                    IF NOT k_held[v_ki] OR k_room[v_ki] <= 0 THEN
                        held_back := true;
                        v_fits := false;
                        EXIT;
                    END IF;
                    IF k_tokens[v_ki] < 1 - 1e-9 THEN
                        v_wait := greatest(0.0, (1 - k_tokens[v_ki]) / k_rate[v_ki]);
                        retry_in := least(coalesce(retry_in, v_wait), v_wait);
                        v_fits := false;
                        EXIT;
                    END IF;
                END LOOP;
                CONTINUE WHEN NOT v_fits;
                FOR j IN 0 .. jsonb_array_length(c_keys[i]) - 1 LOOP
                    v_ki := array_position(k_names, c_keys[i] ->> j);
                    CONTINUE WHEN v_ki IS NULL;
                    k_room[v_ki] := k_room[v_ki] - 1;
                    IF k_tokens[v_ki] IS NOT NULL THEN
                        k_tokens[v_ki] := k_tokens[v_ki] - 1;
                        k_spent[v_ki] := true;
                    END IF;
                END LOOP;
                c_started[i] := true;
                v_started := v_started + 1;
                ids := ids || c_ids[i];
                l_taken[l] := coalesce(l_taken[l], 0) + 1;
                -- Started on a turn other than its lane's next: turns are handed over below.
                v_pos := array_position(w_ids, c_ids[i]);
                IF v_pos IS NULL OR w_rank[v_pos] <> l_taken[l] THEN
                    v_reordered := true;
                END IF;
                EXIT;
            END LOOP;
        END LOOP;
    END LOOP;

    -- 5. The writes: buckets spent, and turns handed over (a key's started jobs take its
    -- earliest turns; the jobs that held those take the started ones' later turns).
    IF true = ANY(k_spent) THEN
        UPDATE controlplane_flowkey f SET tokens = greatest(0.0, v.left_over), refilled_at = v.stamp
          FROM unnest(k_names, k_tokens, k_stamp, k_spent) AS v(name, left_over, stamp, spent)
         WHERE v.spent AND f.key = v.name;
    END IF;
    at := clock_timestamp();  -- after the counts: the jobs start after what they saw end
    IF v_reordered THEN
        WITH lane_turns AS (
                 SELECT u.id, u.key, u.turn,
                        row_number() OVER (PARTITION BY u.key ORDER BY u.turn) AS rank
                   FROM unnest(w_ids, w_keys, w_turns) AS u(id, key, turn)),
             ran AS (
                 SELECT u.id, l_keys[u.lane] AS key, u.turn
                   FROM unnest(c_ids, c_lane, c_turn, c_started) AS u(id, lane, turn, started)
                  WHERE u.started),
             earliest AS (
                 SELECT t.id, t.key, t.turn FROM lane_turns t
                  WHERE t.rank <= (SELECT count(*) FROM ran WHERE ran.key = t.key)),
             holders AS (
                 SELECT e.id, e.key, row_number() OVER (PARTITION BY e.key ORDER BY e.turn) AS rank
                   FROM earliest e WHERE e.id <> ALL(ids)),
             later AS (
                 SELECT r.key, r.turn, row_number() OVER (PARTITION BY r.key ORDER BY r.turn) AS rank
                   FROM ran r WHERE r.id NOT IN (SELECT id FROM earliest))
        UPDATE controlplane_job j SET fair_turn = later.turn
          FROM holders JOIN later ON later.key = holders.key AND later.rank = holders.rank
         WHERE j.id = holders.id AND j.status = 'queued';
    END IF;
END;
$$;
"""


def _postgresql_only(sql: str):
    def run(apps, schema_editor) -> None:
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute(sql)

    return run


class Migration(migrations.Migration):
    dependencies = [
        ("controlplane", "0019_event_job_key_unenforced"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                models.F("queue"),
                models.OrderBy(models.F("priority"), descending=True),
                models.OrderBy(models.F("fair_turn"), descending=True),
                condition=models.Q(("fair_turn__isnull", False), ("status", "queued")),
                name="job_fair_priority_idx",
            ),
        ),
        migrations.RunPython(
            _postgresql_only(CREATE_FUNCTION),
            _postgresql_only(
                "DROP FUNCTION IF EXISTS controlplane_keyed_pick(int, uuid[], text, timestamptz, int, "
                "int, text[], text[], text[], int[], float8[], float8[])"
            ),
        ),
    ]
