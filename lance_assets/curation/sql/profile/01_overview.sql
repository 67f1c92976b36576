-- One row: the table at a glance. `kept` = passes every curation rule in force.
SELECT
    count(*)                                        AS rows,
    sum(n_chars)                                    AS characters,
    sum(n_tokens)                                   AS tokens,
    round(avg(is_dup::INT), 4)                      AS exact_dup_rate,
    round(avg(near_dup::INT), 4)                    AS near_dup_rate,
    round(avg((is_dup OR near_dup)::INT), 4)        AS any_dup_rate,
    count(*) FILTER (WHERE kept)                    AS kept_rows,
    round(avg(kept::INT), 4)                        AS kept_share,
    sum(n_tokens) FILTER (WHERE kept)               AS kept_tokens
FROM corpus
