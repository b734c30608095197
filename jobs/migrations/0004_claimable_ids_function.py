"""PostgreSQL only: ``controlplane_claimable_ids``, the claim's pick, as a function.

The pick walks priority lanes (see ``jobs.claims``). Written as one SQL
statement the walk cost more to plan than the whole claim did to run; here
each step is a plain statement over ``job_claimable_idx``, planned for its
actual values (``force_custom_plan``: no plan cached while the table was
empty). SQLite keeps its single ordered scan.
"""

from django.db import migrations

CREATE_FUNCTION = """
CREATE OR REPLACE FUNCTION controlplane_claimable_ids(
    queues text[],
    ready_at timestamptz,
    wanted int,
    only_operations text[],
    local_operations text[]
) RETURNS SETOF uuid
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_custom_plan
AS $$
DECLARE
    lanes int[];   -- per queue: the priority of the lane to read next (NULL: none left)
    level int;
    need int := wanted;
    taken int;
    found_ids uuid[];
    found_at timestamptz[];
BEGIN
    FOR i IN 1 .. coalesce(array_length(queues, 1), 0) LOOP
        lanes[i] := (SELECT priority FROM controlplane_job WHERE status = 'queued'
                     AND queue = queues[i] ORDER BY priority DESC LIMIT 1);
    END LOOP;
    WHILE need > 0 LOOP
        level := (SELECT max(p) FROM unnest(lanes) AS p);
        EXIT WHEN level IS NULL;
        found_ids := '{}';
        found_at := '{}';
        FOR i IN 1 .. array_length(queues, 1) LOOP
            CONTINUE WHEN lanes[i] IS DISTINCT FROM level;
            SELECT found_ids || array_agg(lane.id), found_at || array_agg(lane.run_after)
              INTO found_ids, found_at
              FROM (SELECT id, run_after FROM controlplane_job
                     WHERE status = 'queued' AND queue = queues[i] AND priority = level
                       AND run_after <= ready_at
                       AND (only_operations IS NULL OR operation = ANY(only_operations))
                       AND (local_operations IS NULL OR operation NOT IN (
                            SELECT name FROM controlplane_remoteoperation
                             WHERE NOT deleted AND name <> ALL(local_operations)))
                     ORDER BY run_after LIMIT need
                     FOR UPDATE SKIP LOCKED) AS lane;
            IF cardinality(found_ids) >= need THEN
                lanes[i] := NULL;  -- enough already: no need to find the next lane
            ELSE
                lanes[i] := (SELECT priority FROM controlplane_job WHERE status = 'queued'
                             AND queue = queues[i] AND priority < level
                             ORDER BY priority DESC LIMIT 1);
            END IF;
        END LOOP;
        -- Queues that meet at one priority: the oldest first across them.
        RETURN QUERY SELECT f.id FROM unnest(found_ids, found_at) AS f(id, ready)
                     ORDER BY f.ready LIMIT need;
        GET DIAGNOSTICS taken = ROW_COUNT;
        need := need - taken;
    END LOOP;
END;
$$;
"""

DROP_FUNCTION = (
    "DROP FUNCTION IF EXISTS controlplane_claimable_ids(text[], timestamptz, int, text[], text[]);"
)


def _postgresql_only(sql: str):
    def run(apps, schema_editor) -> None:
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute(sql)

    return run


class Migration(migrations.Migration):
    dependencies = [("controlplane", "0003_event_reclaim_index")]

    operations = [
        migrations.RunPython(
            _postgresql_only(CREATE_FUNCTION), _postgresql_only(DROP_FUNCTION), elidable=False
        ),
    ]
