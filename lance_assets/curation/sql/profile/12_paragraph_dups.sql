-- requires: dup_paragraph_frac
-- Paragraphs seen in earlier documents (`paragraph_dups` asset): documents by the share of their
-- paragraph characters that repeat an earlier document's, and what curation keeps.
SELECT
    CASE WHEN dup_paragraph_frac IS NULL THEN 'not computed'
         WHEN dup_paragraph_frac = 0 THEN '0'
         WHEN dup_paragraph_frac < 0.25 THEN '(0, 0.25)'
         WHEN dup_paragraph_frac < 0.5 THEN '[0.25, 0.5)'
         WHEN dup_paragraph_frac < 1 THEN '[0.5, 1)'
         ELSE '1 (every paragraph seen before)' END AS repeated_share,
    count(*)                                        AS rows,
    round(count(*) / sum(count(*)) OVER (), 4)      AS share,
    round(avg(kept::INT), 4)                        AS kept_share
FROM corpus
GROUP BY ALL
ORDER BY min(coalesce(dup_paragraph_frac, -1))
