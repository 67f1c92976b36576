-- requires: lang, lang_score
-- Languages detected by fastText lid.176 or CLD2 (`lang`, the `detected_language` asset) next to the source's own
-- label (`language`, FineWeb only), and what curation keeps of each.
SELECT
    lang                                            AS detected,
    coalesce(language, '-')                         AS source_label,
    count(*)                                        AS rows,
    round(count(*) / sum(count(*)) OVER (), 4)      AS share,
    round(avg(lang_score), 3)                       AS mean_lang_score,
    round(avg(kept::INT), 4)                        AS kept_share
FROM corpus
GROUP BY ALL
ORDER BY rows DESC
LIMIT 20
