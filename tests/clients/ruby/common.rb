# Shared by the Ruby client programs of tests/integration/test_other_clients.py: arguments,
# a STOMP 1.2 session on the `stomp` gem (Debian's ruby-stomp), the JSON result line.
#
# Each program does one flow against --host/--port (a broker, or mq-sidecar in front of it)
# and prints, as its LAST stdout line, one JSON object: what it received, in order, and the
# errors it met. Progress lines before it are JSON objects too ({"progress": ...}). A
# watchdog bounds the whole run (--timeout seconds): on expiry the result so far is printed
# with an error and the program exits 2.

require 'json'
require 'optparse'
require 'stomp'

module OtherClient
  # Parse the command line: the common options and the flow's own ({name => default}).
  def self.options(extra = {})
    opts = { host: '127.0.0.1', port: 61613, dest: nil, vhost: '/', timeout: 20.0 }.merge(extra)
    OptionParser.new do |p|
      p.on('--host HOST') { |v| opts[:host] = v }
      p.on('--port PORT', Integer) { |v| opts[:port] = v }
      p.on('--dest DESTINATION') { |v| opts[:dest] = v }
      p.on('--vhost VHOST', 'CONNECT host header (RabbitMQ: the vhost "/")') { |v| opts[:vhost] = v }
      p.on('--timeout SECONDS', Float) { |v| opts[:timeout] = v }
      extra.each_key do |key|
        name = key.to_s.tr('_', '-')
        p.on("--#{name} VALUE") { |v| opts[key] = extra[key].is_a?(Integer) ? Integer(v) : v }
      end
    end.parse!(ARGV)
    raise OptionParser::MissingArgument, '--dest' if opts[:dest].nil?
    opts
  end

  # The JSON result: {"client", "flow", ...flow fields, "errors"}; printed once.
  class Result
    attr_reader :data

    def initialize(flow)
      @data = { 'client' => "ruby-stomp #{Stomp::Version::STRING}", 'flow' => flow, 'errors' => [] }
      @lock = Mutex.new
      @printed = false
    end

    def []=(key, value)
      @lock.synchronize { @data[key] = value }
    end

    def append(key, value)
      @lock.synchronize { (@data[key] ||= []) << value }
    end

    def error(text)
      @lock.synchronize { @data['errors'] << text.to_s }
    end

    def progress(fields)
      @lock.synchronize do
        $stdout.puts(JSON.generate({ 'progress' => fields }))
        $stdout.flush
      end
    end

    # Print the result line (once); returns the exit status to use.
    def emit
      @lock.synchronize do
        return 0 if @printed

        @printed = true
        $stdout.puts(JSON.generate(@data))
        $stdout.flush
        @data['errors'].empty? ? 0 : 1
      end
    end
  end

  # Run the flow's block with a watchdog; print the result and exit.
  def self.run(flow, timeout)
    result = Result.new(flow)
    Thread.new do
      sleep timeout
      result.error("timed out after #{timeout} s")
      result.emit
      exit!(2)
    end
    begin
      yield result
    rescue StandardError => e
      result.error("#{e.class}: #{e.message}")
    end
    exit(result.emit)
  end

  # What a received MESSAGE looks like in the result.
  def self.describe(msg)
    { 'body' => msg.body.to_s, 'headers' => msg.headers.to_h { |k, v| [k.to_s, v.is_a?(Array) ? v : v.to_s] } }
  end

  # One STOMP 1.2 connection (Stomp::Connection, not reliable: no reconnect of the gem's own)
  # with the frames received while waiting for something else kept in order.
  class Session
    attr_reader :conn

    def initialize(opts, result)
      @result = result
      @pending = []
      @receipt_seq = 0
      @conn = Stomp::Connection.new(
        hosts: [{ login: '', passcode: '', host: opts[:host], port: opts[:port] }],
        connect_headers: { 'accept-version' => '1.2', 'host' => opts[:vhost], 'heart-beat' => '0,0' },
        reliable: false,
        connect_timeout: 10,
        max_reconnect_attempts: 1
      )
      frame = @conn.connection_frame
      raise "CONNECT answered #{frame.command}: #{frame.headers['message']}" unless frame.command == 'CONNECTED'
    end

    def next_receipt_id
      @receipt_seq += 1
      "r#{@receipt_seq}"
    end

    # The next frame off the wire (MESSAGE, RECEIPT, ERROR); an ERROR is recorded.
    def read
      frame = @conn.receive
      raise 'the server closed the connection' if frame.nil?

      @result.error("ERROR: #{frame.headers['message']} #{frame.body}".strip) if frame.command == 'ERROR'
      frame
    end

    # Wait for the RECEIPT of +id+; MESSAGEs read meanwhile are kept for #message.
    def wait_receipt(id)
      loop do
        frame = read
        case frame.command
        when 'RECEIPT'
          return if frame.headers['receipt-id'] == id

          stray(frame)
        when 'MESSAGE' then @pending << frame
        when 'ERROR' then raise "ERROR while waiting for RECEIPT #{id}"
        end
      end
    end

    # The next MESSAGE (a kept one first).
    def message
      return @pending.shift unless @pending.empty?

      loop do
        frame = read
        return frame if frame.command == 'MESSAGE'
        raise 'ERROR while waiting for a MESSAGE' if frame.command == 'ERROR'

        stray(frame)
      end
    end

    # A RECEIPT nobody waits for (a receipt header copied from a MESSAGE into a SEND, as
    # unreceive does): recorded in the result's "stray_receipts", in order.
    def stray(frame)
      raise "unexpected #{frame.command} #{frame.headers}" unless frame.command == 'RECEIPT'

      @result.append('stray_receipts', frame.headers['receipt-id'].to_s)
    end

    # Send a frame-producing call with a receipt and wait for it.
    def with_receipt(headers = {})
      id = next_receipt_id
      yield headers.merge('receipt' => id)
      wait_receipt(id)
    end

    # MESSAGEs up to and including the one whose body is +marker+; each is acked
    # individually when +ack+ is true.
    def until_marker(marker, ack: false)
      seen = []
      loop do
        msg = message
        @conn.ack(msg.headers['ack']) if ack
        seen << msg
        return seen if msg.body == marker
      end
    end

    # DISCONNECT with a receipt (the gem reads the next frame as its answer and closes).
    def close
      id = next_receipt_id
      @conn.disconnect('receipt' => id)
      answer = @conn.disconnect_receipt
      return if answer&.command == 'RECEIPT' && answer.headers['receipt-id'] == id

      @result.error("DISCONNECT answered by #{answer&.command} #{answer&.headers}")
    rescue StandardError => e
      @result.error("DISCONNECT: #{e.class}: #{e.message}")
    end
  end
end
