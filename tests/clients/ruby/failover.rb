# A producer and a consumer on one queue while the test kills the broker (through mq-sidecar
# in front of a shared-store pair, the kill -9 of the primary is to go unnoticed).
#
# Consumer session (a thread): SUBSCRIBE client-individual (receipt), take every MESSAGE and
# ACK it, until the marker "end"; a progress line {"progress": {"received": n}} every
# --every MESSAGEs tells the test when to kill. Producer session: SEND m0..m(N-1), persistent,
# each with a receipt awaited, --pace-ms apart; then "end" (receipt).
# Result: {"received": [bodies in order], "redelivered": n, "receipts": n}.

require_relative 'common'

opts = OtherClient.options(count: 200, pace_ms: 5, every: 10)
OtherClient.run('failover', opts[:timeout]) do |result|
  dest = opts[:dest]
  consumer = OtherClient::Session.new(opts, result)
  consumer.with_receipt('id' => 'c', 'ack' => 'client-individual') { |h| consumer.conn.subscribe(dest, h) }
  bodies = []
  redelivered = 0
  taker = Thread.new do
    loop do
      msg = consumer.message
      consumer.conn.ack(msg.headers['ack'])
      bodies << msg.body
      redelivered += 1 if msg.headers['redelivered'] == 'true'
      result.progress('received' => bodies.size) if (bodies.size % opts[:every]).zero?
      break if msg.body == 'end'
    end
  rescue StandardError => e
    result.error("consumer: #{e.class}: #{e.message}")
  end

  producer = OtherClient::Session.new(opts, result)
  receipts = 0
  opts[:count].times do |i|
    producer.with_receipt('persistent' => 'true') { |h| producer.conn.publish(dest, "m#{i}", h) }
    receipts += 1
    sleep(opts[:pace_ms] / 1000.0)
  end
  producer.with_receipt('persistent' => 'true') { |h| producer.conn.publish(dest, 'end', h) }
  taker.join
  result['received'] = bodies
  result['redelivered'] = redelivered
  result['receipts'] = receipts
  producer.close
  consumer.close
end
