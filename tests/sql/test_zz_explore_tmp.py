import psycopg
from conftest import Fabric

def test_explore(fabric: Fabric) -> None:
    su = fabric.su()
    su.execute("SET ROLE fabric_owner")
    su.execute("SELECT set_config('fabric.tenant_id','acme',false), set_config('fabric.actor','os-agt-010',false)")
    try:
        su.execute("""INSERT INTO fabric.memory_records (tenant_id, tier, visibility, subject_id, content, content_hash, source_event_id, formed_by, formation_method, confidence, valid_from, retention_class)
        VALUES ('acme','episodic','subject','u1','{"t":"CANARY-XYZ"}', 'x', 'evt-1','os-agt-010','extraction', 5, now(), 'durable')""")
    except psycopg.Error as e:
        print("ERR", e.sqlstate, e.diag.message_primary, "|", e.diag.message_detail, "|", e.diag.context, "|", e.diag.constraint_name)
    try:
        su.execute("""INSERT INTO fabric.memory_records (tenant_id, tier, visibility, subject_id, content, source_event_id, formed_by, formation_method, confidence, valid_from, retention_class)
        VALUES ('acme','episodic','subject','u1','{"t":"CANARY-XYZ"}', 'evt-1','os-agt-010','extraction', 5, now(), 'durable')""")
    except psycopg.Error as e:
        print("ERR", e.sqlstate, e.diag.message_primary, "|", e.diag.message_detail, "|", e.diag.context, "|", e.diag.constraint_name)
    print(open(fabric.server.logfile).read()[-3000:])
