-- The largest near-duplicate clusters (equal `near_dup_cluster` = one cluster), by id: the
-- profile goes to the run's metadata, which `forget` cannot erase, so it never quotes text
-- (`python -m lance_assets explain --id <kept>` shows a member).
SELECT
    near_dup_cluster                                AS cluster,
    count(*)                                        AS documents,
    min(id)                                         AS kept
FROM corpus
WHERE near_dup_cluster IS NOT NULL
GROUP BY near_dup_cluster
HAVING count(*) > 1
ORDER BY documents DESC, cluster
LIMIT 10
