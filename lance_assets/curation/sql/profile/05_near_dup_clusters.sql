-- The largest near-duplicate clusters (equal `near_dup_cluster` = one cluster).
SELECT
    near_dup_cluster                                AS cluster,
    count(*)                                        AS documents,
    any_value(left(regexp_replace(text, '\s+', ' ', 'g'), 80)) AS example
FROM corpus
WHERE near_dup_cluster IS NOT NULL
GROUP BY near_dup_cluster
HAVING count(*) > 1
ORDER BY documents DESC, cluster
LIMIT 10
