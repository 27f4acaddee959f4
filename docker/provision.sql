-- The service logins of a deployment, run once after `memfabric db migrate` (the group roles
-- exist then) by a superuser, and again whenever a password changes:
--
--   psql "$DATABASE_URL" -v ON_ERROR_STOP=1 -v committer_password=... -v consolidator_password=...
--        -v projector_password=... -v maintainer_password=... -v tracer_password=...
--        -f docker/provision.sql
--
-- Each service has its own login, a member of one group role, nothing else. The committer and
-- the consolidator act as registered agents (their agent ids are the actors of what they
-- write); enable them per tenant with fabric_api.enable_agent when a tenant is created.

SELECT pg_catalog.format('CREATE ROLE %I LOGIN', l)
FROM pg_catalog.unnest(ARRAY['os_agt_010', 'os_agt_011', 'memfabric_projector',
                             'memfabric_maintainer', 'memfabric_tracer']) AS l
WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles r WHERE r.rolname = l) \gexec

ALTER ROLE os_agt_010 PASSWORD :'committer_password';
ALTER ROLE os_agt_011 PASSWORD :'consolidator_password';
ALTER ROLE memfabric_projector PASSWORD :'projector_password';
ALTER ROLE memfabric_maintainer PASSWORD :'maintainer_password';
ALTER ROLE memfabric_tracer PASSWORD :'tracer_password';

GRANT fabric_committer TO os_agt_010;
GRANT fabric_consolidator TO os_agt_011;
GRANT fabric_projector TO memfabric_projector;
GRANT fabric_maintainer TO memfabric_maintainer;
GRANT fabric_tracer TO memfabric_tracer;

SELECT fabric_api.register_agent('os-agt-010', 'os_agt_010', '{}', '{}');
SELECT fabric_api.register_agent('os-agt-011', 'os_agt_011', '{}', '{}');
