-- requires: pii_email_count, pii_phone_count, pii_ip_count, pii_card_count
-- Personal data (`personal_data` asset): documents holding each kind, how many were found, and
-- how many of those documents curation keeps (redact them with token_ids' redact_pii).
SELECT kind, count(*) FILTER (WHERE n > 0) AS rows_with_it, coalesce(sum(n), 0)::BIGINT AS found,
       count(*) FILTER (WHERE n > 0 AND kept) AS kept_rows_with_it
FROM (
    SELECT 'email' AS kind, pii_email_count AS n, kept FROM corpus
    UNION ALL SELECT 'phone', pii_phone_count, kept FROM corpus
    UNION ALL SELECT 'ip', pii_ip_count, kept FROM corpus
    UNION ALL SELECT 'card', pii_card_count, kept FROM corpus
)
GROUP BY kind
ORDER BY kind
