-- requires: quality_score
-- The learned quality score (`quality_score` asset) in buckets, against the label it learned
-- from (`score`), and what curation keeps of each bucket.
SELECT
    CASE WHEN quality_score IS NULL THEN 'not scored'
         ELSE least(greatest(floor(quality_score), 0), 5)::INT::VARCHAR END AS predicted_bucket,
    count(*)                                        AS rows,
    round(avg(score), 2)                            AS mean_label,
    round(avg(quality_score), 2)                    AS mean_predicted,
    round(avg(kept::INT), 4)                        AS kept_share
FROM corpus
GROUP BY ALL
ORDER BY predicted_bucket
