-- Exact (`is_dup`) and near (`near_dup`) duplicates, and how they overlap.
SELECT
    CASE WHEN is_dup AND near_dup THEN 'exact and near'
         WHEN is_dup THEN 'exact only'
         WHEN near_dup THEN 'near only'
         WHEN is_dup IS NULL OR near_dup IS NULL THEN 'not computed'
         ELSE 'unique' END                          AS kind,
    count(*)                                        AS rows,
    round(count(*) / sum(count(*)) OVER (), 4)      AS share
FROM corpus
GROUP BY ALL
ORDER BY rows DESC
